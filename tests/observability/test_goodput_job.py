"""A real job with a kill -9, a restart and a slow rank, accounted by `aioelastic report`.

The job is ``examples/goodput_train.py`` (over gloo where torch is importable, else plain
Python workers using the worker API): rank 1 kills itself with SIGKILL at step 25 of the first
generation, rank 2 works three times longer per step, rank 0 checkpoints every 10 steps. It runs
under ``--recovery restart`` (the group restarts) and ``--recovery in-place`` (rank 1 is
replaced in a new generation).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.events import LoggedEvent, read_event_log

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "goodput_train.py"
BOUND = 240
"""Generous bound (seconds): six real workers (importing torch where it is there) and a
restart on a loaded 2-core machine."""
WINDOW = "1"
"""The straggler window (seconds): a step is 50 ms (150 ms on the slow rank)."""


async def aioelastic(*args: str | Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    with anyio.fail_after(BOUND):
        done = await anyio.run_process(
            [sys.executable, "-m", "aioelastic", *map(str, args)],
            check=False,
            env={**os.environ, **(env or {})},
        )
    return done.returncode, (done.stdout.decode() + done.stderr.decode())


@pytest.fixture(scope="module", params=["restart", "in-place"])
def job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[LoggedEvent], dict[str, Any]]:
    """Run the job once per recovery mode; its event log and its `report --json` object."""
    tmp = tmp_path_factory.mktemp("goodput")
    events = tmp / "events.jsonl"

    async def run() -> tuple[list[LoggedEvent], dict[str, Any]]:
        code, output = await aioelastic(
            "run", "--standalone", "--nproc-per-node", "3", "--max-restarts", "1",
            "--recovery", request.param, "--events-file", events, EXAMPLE, tmp / "ckpt",
            "--crash-at", "25", "--slow-rank", "2",
            env={"AIOELASTIC_STRAGGLER_WINDOW": WINDOW},
        )  # fmt: skip
        assert code == 0, output
        code, output = await aioelastic("report", events, "--json")
        assert code == 0, output
        return list(read_event_log(events)), json.loads(output)

    return anyio.run(run)


def test_the_categories_add_up_to_the_wall_time(
    job: tuple[list[LoggedEvent], dict[str, Any]],
) -> None:
    """Productive time and every badput cause add up to the job's wall time (within 1%)."""
    events, report = job
    wall = max(e.time for e in events) - min(e.time for e in events)
    total = report["productive_seconds"] + sum(report["badput_seconds"].values())
    assert report["wall_seconds"] == pytest.approx(wall)
    assert abs(total - wall) <= 0.01 * wall
    assert abs(report["goodput"] + sum(report["badput"].values()) - 1) <= 0.01
    assert 0 < report["goodput"] < 1
    assert report["badput"]["startup"] > 0


def test_the_recovery_runs_from_the_kill_to_the_first_step_after_the_restart(
    job: tuple[list[LoggedEvent], dict[str, Any]],
) -> None:
    """The one recovery is rank 1's SIGKILL, from its failure to the first step of the job's
    next life (the restarted group, or the next generation)."""
    events, report = job
    (failed,) = [e.data["failure"] for e in events if e.kind == "WorkerFailed"]
    assert (failed["rank"], failed["returncode"]) == (1, -9)
    lives = {
        (e.data["restart_count"], e.data["generation"]) for e in events if e.kind == "StepsMarked"
    }
    assert len(lives) == 2
    first_marks: dict[int, float] = {}
    for e in events:
        if e.kind == "StepsMarked" and (e.data["restart_count"], e.data["generation"]) == max(
            lives
        ):
            rank = e.data["rank"]
            first_marks[rank] = min(first_marks.get(rank, e.data["times"][0]), *e.data["times"])
    resumed = max(first_marks.values())  # the job's first step: when its last rank began it
    expected = resumed - failed["timestamp"]
    (recovery,) = report["recoveries"]
    assert (recovery["cause"], recovery["rank"]) == ("WorkerFailed", 1)
    assert recovery["seconds"] == pytest.approx(expected, rel=1e-6)
    assert report["badput_seconds"]["recovery"] == pytest.approx(expected, rel=0.01)


def test_the_slow_rank_is_named_within_three_windows_and_no_other_is(
    job: tuple[list[LoggedEvent], dict[str, Any]],
) -> None:
    """The agent names rank 2 a straggler within its first 3 scored windows, and no other rank
    ever; the report names rank 2 only."""
    events, report = job
    windows = [e.data for e in events if e.kind == "StepTimes" and len(e.data["ranks"]) > 1]
    assert windows, "no window scored two ranks"
    assert any(w["stragglers"] == [2] for w in windows[:3])
    assert {rank for w in windows for rank in w["stragglers"]} == {2}
    detected = [e.data["rank"] for e in events if e.kind == "StragglerDetected"]
    assert detected == [2]
    assert [s["rank"] for s in report["stragglers"]] == [2]
    medians = report["rank_step_seconds"]
    assert medians["2"] > report["straggler_window"]["factor"] * max(medians["0"], medians["1"])


def test_the_steps_lost_to_the_kill_are_re_done(
    job: tuple[list[LoggedEvent], dict[str, Any]],
) -> None:
    """Where the ranks run in lockstep (torch), the steps after the checkpoint are re-done."""
    pytest.importorskip("torch", reason="plain workers do not run in lockstep")
    _, report = job
    assert report["steps"]["last"] == 39
    assert report["steps"]["redone"] >= 1  # from the checkpoint (20) to the step reached
    assert report["badput_seconds"]["redone"] > 0


ASK_STATUS = """\
import json, subprocess, sys, time
from pathlib import Path
from aioelastic import worker
found, endpoint = Path(sys.argv[1]), sys.argv[2]
status = [sys.executable, "-m", "aioelastic", "status", "--rdzv-endpoint", endpoint,
          "--rdzv-id", "job", "--json"]
for world in worker.worlds():
    with world:
        for step in range(3000):
            if found.exists():
                break
            world.step(step)
            time.sleep(0.15 if world.rank == 2 else 0.05)  # pace
            world.work_done()
            if world.rank == 0 and step % 10 == 9:
                shown = json.loads(subprocess.run(status, capture_output=True, check=True).stdout)
                if shown["stragglers"]:
                    found.with_suffix(".tmp").write_text(json.dumps(shown))
                    found.with_suffix(".tmp").rename(found)
"""


def test_status_names_the_straggler_while_the_job_runs(tmp_path: Path) -> None:
    """`aioelastic status` (asked by rank 0 between its steps) shows each rank's step time and
    names the slow rank, from what the agent keeps in the round's store."""
    script, found = tmp_path / "ask.py", tmp_path / "status.json"
    script.write_text(ASK_STATUS)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"

    async def run() -> tuple[int, str]:
        return await aioelastic(
            "run", "--nnodes", "1", "--nproc-per-node", "3", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "job", script, found, endpoint,
            env={"AIOELASTIC_STRAGGLER_WINDOW": "0.5"},
        )  # fmt: skip

    code, output = anyio.run(run)
    assert code == 0, output
    shown = json.loads(found.read_text())
    assert list(shown["stragglers"]) == ["2"]
    (node,) = shown["step_times"]
    assert "2" in node["medians"]  # with a faster rank (rank 0 may mark no step in a window:
    assert len(node["medians"]) >= 2  # it spends it asking for the status)
