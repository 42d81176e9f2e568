"""``aioelastic run --recovery in-place``: real agents, real workers, real gloo, real kill -9."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic._launcher.cli_status import fetch_status
from aioelastic.rendezvous._status import format_status
from tests.agent.conftest import BOUND, WORKER, free_port, launched, wait_gone

pytestmark = pytest.mark.anyio

WORKERS = Path(__file__).parent / "workers"
TORCH_WORKER = str(WORKERS / "inplace_torch.py")
PLAIN_WORKER = str(WORKERS / "inplace_plain.py")
EXAMPLES = Path(__file__).parents[2] / "examples"
IN_PLACE = ["--standalone", "--recovery", "in-place"]


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


def members(text: str, generation: int) -> dict[int, int]:
    """Rank -> pid of ``generation``, as its workers reported it."""
    pattern = rf"gen {generation} rank (\d+) of \d+ pid (\d+)"
    return {int(rank): int(pid) for rank, pid in re.findall(pattern, text)}


def check_every_sum(text: str) -> dict[int, int]:
    """Every step's all_reduce summed exactly the pids of its generation; steps per generation."""
    steps: dict[int, int] = {}
    for gen, _rank, _step, total in re.findall(r"gen (\d+) rank (\d+) step (\d+) sum (\d+)", text):
        expected = sum(members(text, int(gen)).values())
        assert int(total) == expected, f"generation {gen} summed {total}, its members {expected}"
        steps[int(gen)] = steps.get(int(gen), 0) + 1
    return steps


def spares_started(text: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"started a spare worker: pid (\d+)", text)]


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("spares", [0, 1])
async def test_kill_9_replaces_one_worker_and_the_survivors_train_on(spares: int) -> None:
    """4 gloo workers, one killed: survivors keep their pids, every sum is exactly its world's."""
    argv = [*IN_PLACE, "--nproc-per-node", "4", "--spares", str(spares)]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv, TORCH_WORKER, "--steps", "30") as run:
            await run.out.wait_for("gen 1 rank 2 step 3 sum")
            victim = members(run.out.text, 1)[2]
            os.kill(victim, signal.SIGKILL)
            status = await run.wait()
    assert status == 0, run
    first, second = members(run.out.text, 1), members(run.out.text, 2)
    assert [first[r] for r in (0, 1, 3)] == [second[r] for r in (0, 1, 3)]
    assert second[2] != victim
    assert f"gen 2 rank 2 of 4 pid {second[2]} fresh 1" in run.out.text
    steps = check_every_sum(run.out.text)
    assert set(steps) == {1, 2}
    assert sum(steps.values()) >= 30 * 4
    assert "rank 2 failed: killed by SIGKILL" in run.err.text
    assert "generation 2 formed" in run.err.text
    assert "restarting the worker group" not in run.err.text
    for pid in second.values():
        assert f"done pid {pid} step 30" in run.out.text
    if spares:
        started = spares_started(run.err.text)
        assert second[2] == started[0]  # the spare took the place
        assert len(started) == 2  # and a new spare was started
        assert f"rank 2 -> spare pid {started[0]}" in run.err.text


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_a_workers_own_exception_fails_that_worker(tmp_path: Path) -> None:
    """Rank 1 raises while its world is valid: it fails with its traceback, the others go on."""
    argv = [*IN_PLACE, "--nproc-per-node", "3"]
    script = [TORCH_WORKER, "--steps", "8", "--raise-at", "3", "--marker", str(tmp_path / "m")]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv, *script) as run:
            status = await run.wait()
    assert status == 0, run
    assert "rank 1 failed: exit code 1" in run.err.text
    assert "ValueError: rank 1's own bug at step 3" in run.err.text
    assert "rank 0 failed" not in run.err.text
    assert "rank 2 failed" not in run.err.text
    first, second = members(run.out.text, 1), members(run.out.text, 2)
    assert first[1] != second[1]
    assert [first[r] for r in (0, 2)] == [second[r] for r in (0, 2)]
    check_every_sum(run.out.text)


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_a_hung_peer_is_evicted_and_the_survivors_leave_their_collective(
    tmp_path: Path,
) -> None:
    """Rank 2 hangs: the others' gloo collectives time out (the world's timeout), the agent
    evicts the silent rank, a spare takes it, the survivors go on in their processes."""
    argv = [*IN_PLACE, "--nproc-per-node", "3", "--spares", "1", "--recovery-timeout", "8"]
    script = [TORCH_WORKER, "--steps", "8", "--stop-at", "3", "--marker", str(tmp_path / "m")]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv, *script) as run:
            status = await run.wait()
    assert status == 0, run
    first, second = members(run.out.text, 1), members(run.out.text, 2)
    assert f"evicted rank 2 (pid {first[2]}): 2 of 3 ranks' collectives failed" in run.err.text
    assert [first[r] for r in (0, 1)] == [second[r] for r in (0, 1)]
    assert second[2] == spares_started(run.err.text)[0]
    check_every_sum(run.out.text)


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_the_in_place_example_runs() -> None:
    """examples/agent_inplace_torch.py trains to the end under in-place recovery with a spare."""
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--spares", "1"]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv, str(EXAMPLES / "agent_inplace_torch.py")) as run:
            status = await run.wait()
    assert status == 0, run
    assert run.out.text.count("finished at step") == 2


async def test_a_generation_that_does_not_form_in_time_falls_back_to_a_restart(
    tmp_path: Path,
) -> None:
    """The replacement hangs before asking for a world: after the timeout, a full restart."""
    hang, finish = tmp_path / "hang", tmp_path / "finish"
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--max-restarts", "1", "--recovery-timeout", "2"]
    script = [PLAIN_WORKER, "--hang-once", str(hang), "--exit-when", str(finish)]
    with anyio.fail_after(BOUND):
        async with launched(*argv, *script) as run:
            await run.out.wait_for("gen 1 rank", count=2)
            hang.write_text("")
            os.kill(members_plain(run.out.text, 1)[1], signal.SIGKILL)
            await run.err.wait_for("restarting the worker group (1/1)")
            await run.out.wait_for("gen 3 rank", count=2)
            finish.write_text("")
            status = await run.wait()
    assert status == 0, run
    assert (
        "in-place recovery fell back to a restart: generation 2 did not form within 2 s: "
        "rank 1 (worker 0.2) never asked for a world"
    ) in run.err.text
    assert "hanging pid" in run.out.text


async def test_workers_that_do_not_use_the_api_keep_todays_behaviour() -> None:
    """Under --recovery in-place, a worker that never asks for a world fails as a restart."""
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--max-restarts", "1"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--fail-rank", "1") as run:
            status = await run.wait()
    assert status == 0, run
    assert "before every worker asked for a world" in run.err.text
    assert "restarting the worker group (1/1)" in run.err.text


def members_plain(text: str, generation: int) -> dict[int, int]:
    """Rank -> pid of ``generation`` for the plain worker."""
    pattern = rf"gen {generation} rank (\d+) pid (\d+)"
    return {int(rank): int(pid) for rank, pid in re.findall(pattern, text)}


async def test_leaving_the_loop_after_a_world_ended_says_what_to_write(tmp_path: Path) -> None:
    """A `break` after `with world:` when a world ended: the worker and the agent both say what
    happened and where the `break` belongs, and the job falls back to a restart that ends."""
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--max-restarts", "1"]
    script = [str(WORKERS / "inplace_break.py"), "--marker", str(tmp_path / "killed")]
    with anyio.move_on_after(BOUND) as waited:  # under pytest's own timeout: keep the consoles
        async with launched(*argv, *script) as run:
            status = await run.wait()
    assert not waited.cancelled_caught, f"the job did not end within {BOUND} s: {run}"
    assert status == 0, run
    assert "this rank left worker.worlds() after generation 1 ended under it" in run.err.text
    assert (
        "rank 0 exited 0 while generation 2 formed: its world ended under it and it left "
        "worker.worlds() instead of joining the next one (a `break` after `with world:`? put "
        "it inside the block, after training returns)"
    ) in run.err.text, run


async def test_two_ranks_dying_at_once_with_one_spare_form_the_world_again() -> None:
    """Both ranks of generation 1 die together (rank 1 kills rank 0 and itself): the spare
    takes the first slot and a new process the second (generation 2, which the second death
    ends, never formed), and generation 3 forms with them and finishes the job (a spare nobody
    had started held it until the recovery timeout, then fell back)."""
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--spares", "1", "--max-restarts", "0"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, str(WORKERS / "inplace_two_die.py")) as run:
            status = await run.wait()
    assert status == 0, run
    assert re.search(r"generation 3: .*-> new process pid [1-9]", run.err.text), run
    assert "generation 3 formed" in run.err.text, run
    assert sorted(re.findall(r"gen 3 rank (\d) pid \d+ all in", run.out.text)) == ["0", "1"]


async def test_spares_need_in_place_recovery() -> None:
    """--spares without --recovery in-place is refused with one line naming both flags."""
    async with launched("--standalone", "--spares", "1", WORKER) as run:
        status = await run.wait()
    assert status == 2
    assert "--spares needs --recovery in-place" in run.err.text


async def test_status_shows_the_generation_and_the_spares(tmp_path: Path) -> None:
    """aioelastic status reads a node's generation, its pids and its ready spare."""
    port, finish = free_port(), tmp_path / "finish"
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "gen"]
    argv = ["--nnodes", "1", *rdzv, "--nproc-per-node", "2", "--recovery", "in-place"]
    with anyio.fail_after(BOUND):
        async with launched(
            *argv, "--spares", "1", PLAIN_WORKER, "--exit-when", str(finish)
        ) as run:
            await run.out.wait_for("asking pid", count=3)
            spare = int(re.findall(r"started a spare worker: pid (\d+)", run.err.text)[0])
            endpoint = f"127.0.0.1:{port}"
            while True:  # the agent shows each change right after making it
                status = await fetch_status("c10d", endpoint, "gen", {}, 10.0)
                shown = status.generations
                if shown and shown[0].spares and shown[0].phase == "running":
                    break
            finish.write_text("")
            assert await run.wait() == 0, run
    (world,) = status.generations
    assert (world.generation, world.phase, world.spares) == (1, "running", (spare,))
    assert sorted(world.pids) == sorted(members_plain(run.out.text, 1).values())
    assert f"generation 1 (running), world size 2, pids {' '.join(map(str, world.pids))}; " in (
        format_status(status)
    )


async def test_sigterm_stops_the_workers_and_the_spare(tmp_path: Path) -> None:
    """A shutdown signal under in-place recovery stops every worker and spare, status 143."""
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--spares", "1"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, PLAIN_WORKER, "--exit-when", str(tmp_path / "never")) as run:
            await run.out.wait_for("asking pid", count=3)
            await run.out.wait_for("gen 1 rank", count=2)
            run.send_signal(signal.SIGTERM)
            status = await run.wait()
        pids = [int(p) for p in re.findall(r"asking pid (\d+)", run.out.text)]
        for pid in pids:
            await wait_gone(pid)
    assert status == 128 + signal.SIGTERM, run
    assert len(pids) == 3
    assert "2 sent SIGTERM" in run.err.text, run
    assert "generation 2" not in run.err.text, run  # the signal's deaths are not recovered
    assert "SIGKILL" not in run.err.text, run  # every worker ended before the deadline


async def test_sigterm_reaches_workers_that_never_asked_for_a_world() -> None:
    """Under in-place recovery, workers that do not use the worker API (no generation was ever
    assigned) get the signal too, and the run ends when they exit, not at the deadline."""
    argv = [*IN_PLACE, "--nproc-per-node", "2"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--block-unless-nodes", "99") as run:
            await run.out.wait_for("pids", count=2)
            run.send_signal(signal.SIGTERM)
            status = await run.wait()
    assert status == 128 + signal.SIGTERM, run
    assert "2 sent SIGTERM" in run.err.text, run
    assert "SIGKILL" not in run.err.text, run


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_the_same_script_runs_under_restart_recovery() -> None:
    """Without --recovery in-place, worlds() yields one world from torch's environment."""
    argv = ["--standalone", "--nproc-per-node", "2"]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv, TORCH_WORKER, "--steps", "3") as run:
            status = await run.wait()
    assert status == 0, run
    assert set(members(run.out.text, 1)) == {0, 1}
    assert check_every_sum(run.out.text) == {1: 6}


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_a_spare_stays_out_of_the_files_a_logs_specs_lays_out(tmp_path: Path) -> None:
    """Under --logs-specs, each rank's file holds only its own worker's lines: a spare (which
    holds no rank) writes to the console, not into slot 0's file."""
    from tests.agent.test_torchrun_parity import install_logs_specs_plugin

    env = install_logs_specs_plugin(tmp_path)
    logs, finish = tmp_path / "logs", tmp_path / "finish"
    argv = [*IN_PLACE, "--nproc-per-node", "2", "--spares", "1"]
    argv += ["--logs-specs", "flat", "--log-dir", str(logs)]
    files = [logs / f"rank{rank}-attempt0.out" for rank in range(2)]
    with anyio.fail_after(BOUND):
        async with launched(*argv, PLAIN_WORKER, "--exit-when", str(finish), env=env) as run:
            await run.err.wait_for("started a spare worker")
            spare = spares_started(run.err.text)[0]

            def settled() -> bool:  # both ranks in their world, the spare asking somewhere
                shown = [f.read_text() if f.exists() else "" for f in files]
                spoke = f"asking pid {spare}" in run.out.text + shown[0]
                return spoke and all("gen 1 rank" in text for text in shown)

            while not settled():  # noqa: ASYNC110 (files give no change notice to wait on)
                await anyio.sleep(0.05)  # pace
            finish.write_text("")
            assert await run.wait() == 0, run
    assert f"asking pid {spare}" in run.out.text
    for rank, file in enumerate(files):
        asked = re.findall(r"asking pid (\d+)", file.read_text())
        assert asked == [str(members_plain(file.read_text(), 1)[rank])], file.read_text()
