"""The record of a successful in-place run with a spare (issue 39, item 5): the result, the
events and the timeline agree on who held each rank at the end."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.events import read_event_log
from aioelastic.events._timeline import build_timeline
from tests.agent.conftest import BOUND, launched

pytestmark = pytest.mark.anyio

PLAIN_WORKER = str(Path(__file__).parent / "workers" / "inplace_plain.py")


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


def members(text: str, generation: int) -> dict[int, int]:
    """Rank -> pid of ``generation``, as its workers printed it."""
    found = re.findall(rf"gen {generation} rank (\d+) pid (\d+)", text)
    return {int(rank): int(pid) for rank, pid in found}


@pytest.fixture
async def replaced_run(tmp_path: Path) -> tuple[Path, dict[int, int], dict[int, int]]:
    """``--recovery in-place --spares 1``, rank 0 killed (SIGKILL), then every rank finishes:
    the events file and the members of generations 1 and 2."""
    events, finish = tmp_path / "events.jsonl", tmp_path / "finish"
    argv = ["--standalone", "--recovery", "in-place", "--nproc-per-node", "2", "--spares", "1"]
    argv += ["--events-file", str(events), PLAIN_WORKER, "--exit-when", str(finish)]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv) as run:
            await run.out.wait_for("gen 1 rank", count=2)
            first = members(run.out.text, 1)
            os.kill(first[0], signal.SIGKILL)
            await run.out.wait_for("gen 2 rank", count=2)
            second = members(run.out.text, 2)
            finish.touch()
            status = await run.wait()
    assert status == 0, run
    assert (second[1], second[0] != first[0]) == (first[1], True)
    return events, first, second


async def test_the_results_returncodes_are_the_final_holders(
    replaced_run: tuple[Path, dict[int, int], dict[int, int]],
) -> None:
    """returncodes says 0 for both ranks (their final holders), not the stopped spare's -15."""
    events, _, second = replaced_run
    records = list(read_event_log(events))
    [finished] = [r for r in records if r.kind == "RunFinished"]
    assert finished.data["result"]["returncodes"] == {"0": 0, "1": 0}
    succeeded = {r.data["rank"]: r.data["pid"] for r in records if r.kind == "WorkerSucceeded"}
    assert succeeded == second


async def test_the_timeline_continues_the_replaced_rank_with_its_replacement(
    replaced_run: tuple[Path, dict[int, int], dict[int, int]],
) -> None:
    """Rank 0's lane: the killed worker's life drawn failed, then the spare's to its success."""
    events, first, second = replaced_run
    records = list(read_event_log(events))
    timeline = build_timeline(records)
    node = records[0].node
    lives = [
        (span.label.split(",")[0], span.outcome)
        for span in timeline.spans
        if span.lane == f"rank 0 ({node})"
    ]
    assert lives == [(f"pid {first[0]}", "failed"), (f"pid {second[0]}", "succeeded")]
    [succeeded] = [r for r in records if r.kind == "WorkerSucceeded" and r.data["rank"] == 0]
    replacement = [s for s in timeline.spans if s.label.startswith(f"pid {second[0]},")]
    assert replacement[0].end == pytest.approx(succeeded.time - records[0].time)


async def test_the_drawn_timeline_keeps_every_label_inside_and_apart(
    replaced_run: tuple[Path, dict[int, int], dict[int, int]], tmp_path: Path
) -> None:
    """In the picture of the run, no mark's label leaves the plot (the last one included) or
    covers another."""
    pytest.importorskip("matplotlib", reason="needs the timeline extra (matplotlib)")
    from aioelastic.events._timeline import draw_timeline, render_timeline

    timeline = build_timeline(read_event_log(replaced_run[0]))
    render_timeline(timeline, str(tmp_path / "run.png"))
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    figure = draw_timeline(timeline)
    figure.canvas.draw()
    [axes] = figure.axes
    renderer = figure.canvas.get_renderer()
    labels = [text.get_window_extent(renderer) for text in axes.texts]
    last = max(timeline.marks, key=lambda mark: mark.time)
    assert last.label in [text.get_text() for text in axes.texts]
    plot = axes.get_window_extent(renderer)
    for index, label in enumerate(labels):
        inside = (
            plot.x0 <= label.x0,
            label.x1 <= plot.x1,
            plot.y0 <= label.y0,
            label.y1 <= plot.y1,
        )
        assert inside == (True, True, True, True), axes.texts[index]
        for other in labels[index + 1 :]:
            assert not label.overlaps(other), (axes.texts[index], other)
