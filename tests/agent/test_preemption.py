"""The agent's side of a preemption, apart from real hosts: what ``aioelastic status`` reads
back from the store, and the run's final line."""

from __future__ import annotations

import functools
import json
import signal
from pathlib import Path

import anyio
import pytest

from aioelastic.agent._group import Outcome
from aioelastic.agent._preemption import (
    NOTICE_KEY,
    READY_KEY,
    STOP_KEY,
    Preemption,
    PreemptionRecord,
    ended_key,
)
from aioelastic.agent._status import read_preemption
from aioelastic.rendezvous._status import PreemptionStatus, RunStatus, format_status
from aioelastic.store import MemoryStore
from aioelastic.testing import FaultyStore
from tests.agent.conftest import BOUND, launched


def round_items(round_: int, items: dict[str, bytes]) -> dict[str, bytes]:
    """Keys of the round's store as ``status`` reads them (relative to the run)."""
    return {f"store/{round_}/{key}": value for key, value in items.items()}


def test_a_run_never_preempted_has_no_preemption() -> None:
    """Without a notice in the last round's store, status shows no preemption."""
    assert read_preemption({"store/2/other": b"x"}, 2) is None


def test_status_reads_the_notice_the_stop_step_and_what_each_node_did() -> None:
    """Every key the agents leave is read back: who, which signal, the step, each node's end."""
    ended = {"step": 9, "saved": [0, 1], "no_boundary": [], "unsaved": [], "since_notice": 0.4}
    items = round_items(
        3,
        {
            NOTICE_KEY: PreemptionRecord(2, 15, "signal", 30.0).encode(),
            STOP_KEY: b"9",
            READY_KEY: b"3",
            ended_key(0): json.dumps(ended).encode(),
        },
    )
    assert read_preemption(items, 3) == PreemptionStatus(2, "SIGTERM", 30.0, 9, 3, {0: ended})
    assert read_preemption(items, 2) is None  # another round's keys are not this round's


def test_status_prints_the_preemption_under_the_round() -> None:
    """The table says who preempted the job, the stop step and each node's saves."""
    ended = {"saved": [2], "no_boundary": [3], "unsaved": [], "since_notice": 1.25}
    status = RunStatus(
        "job",
        4,
        closed=True,
        participants=(),
        waiting=(),
        lost={},
        nodes_seen=2,
        preemption=PreemptionStatus(0, "notice file", 30.0, None, 1, {1: ended}),
    )
    lines = format_status(status).splitlines()
    assert lines[1:] == [
        "  preempted by node 0 (notice file, 30 s deadline): not agreed yet, 1 node ready",
        "  node of rank 1: saved ranks 2; no step boundary ranks 3 (1.25 s after the notice)",
    ]


def saved_steps(directory: Path) -> list[int]:
    """The step each rank of the example saved at."""
    return [int(path.read_text()) for path in directory.glob("rank-*.step")]


EXAMPLE = Path(__file__).parents[2] / "examples" / "preemption_loop.py"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    "recovery",
    [(), ("--recovery", "in-place", "--spares", "1")],
    ids=["restart", "in-place-with-a-spare"],
)
async def test_the_preemption_example_saves_every_rank_at_one_step(
    tmp_path: Path, recovery: tuple[str, ...]
) -> None:
    """The 10-line loop under ``aioelastic run``: SIGTERM once both ranks train; both save at
    one step and the run says so, exiting 128 + SIGTERM (in place: the spare is no rank and
    gets no signal, so nothing fails)."""
    argv = ["--standalone", "--nproc-per-node", "2", *recovery, str(EXAMPLE), str(tmp_path)]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            await run.out.wait_for("training", count=2)
            run.send_signal(signal.SIGTERM)
            status = await run.wait()
    steps = saved_steps(tmp_path)
    assert len(steps) == 2, run
    assert len(set(steps)) == 1, run
    assert f"run preempted, saved at step {steps[0]} (node 0's SIGTERM)" in run.err.text
    assert "failed" not in run.err.text, run
    assert status == 128 + signal.SIGTERM, run


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_notice_file_preempts_the_job_as_sigterm_does(tmp_path: Path) -> None:
    """``--preemption-file``: the file appearing is the scheduler's notice; the ranks save at
    one step and the run ends preempted by the notice file (exit status 128 + SIGTERM)."""
    notice, out = tmp_path / "notice", tmp_path / "out"
    argv = ["--standalone", "--nproc-per-node", "2", "--preemption-file", str(notice)]
    with anyio.fail_after(BOUND):
        async with launched(*argv, str(EXAMPLE), str(out)) as run:
            await run.out.wait_for("training", count=2)
            await anyio.Path(notice).write_text("preempted\n")
            status = await run.wait()
    steps = saved_steps(out)
    assert len(steps) == 2, run
    assert len(set(steps)) == 1, run
    assert f"run preempted, saved at step {steps[0]} (node 0's notice file)" in run.err.text
    assert status == 128 + signal.SIGTERM, run


HUNG_ON_THE_API = """
import time
from aioelastic import worker
for world in worker.worlds():
    with world:
        world.should_stop(0)
        print("entered", flush=True)
        time.sleep(600)  # never reaches another step boundary
"""


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_second_signal_stops_the_node_at_once(tmp_path: Path) -> None:
    """A worker on the API that never reaches a boundary holds the preemption until its
    deadline; a second SIGTERM does not wait for it: the signal is forwarded, the run stops."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG_ON_THE_API)
    argv = ["--standalone", "--nproc-per-node", "1", "--shutdown-timeout", "600", str(script)]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            await run.out.wait_for("entered")
            run.send_signal(signal.SIGTERM)
            await run.err.wait_for("job preempted by node 0")
            run.send_signal(signal.SIGTERM)
            status = await run.wait()
    assert "run stopped: stopped by SIGTERM" in run.err.text, run
    assert status == 128 + signal.SIGTERM, run


@pytest.mark.anyio
async def test_a_signal_the_job_cannot_be_told_of_stops_this_node(tmp_path: Path) -> None:
    """The store is lost when the signal comes: the node stops on its own, as before (the
    signal forwarded to its workers), instead of restarting them or waiting for a notice."""
    stopped: list[int] = []
    done = anyio.Event()

    def stop_node(signum: int) -> None:
        stopped.append(signum)
        done.set()

    preemption = Preemption(
        str(tmp_path), timeout=5.0, emit=lambda event: None, stop_node=stop_node
    )
    store = FaultyStore(MemoryStore())
    store.partition()
    assert preemption.request(signal.SIGHUP)
    assert not preemption.request(signal.SIGHUP)  # a second signal: the caller stops at once

    async def rendezvous() -> tuple[Outcome, str]:
        await anyio.sleep_forever()
        raise AssertionError

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            functools.partial(
                preemption.watch, rendezvous, store=store, node=0, nodes=1, group=None
            )
        )
        with anyio.fail_after(BOUND):
            await done.wait()
        tg.cancel_scope.cancel()
    assert stopped == [signal.SIGHUP]
    assert preemption.active is None
