"""``world.store`` in workers that cannot import torch: real agents, real processes, kill -9.

The worker (``workers/store_worker.py``) hides torch, writes its pid in its generation's store,
reads every member's and reports them with the number of keys its generation's store holds;
the tests check that each generation saw exactly its own members, on one node and across
three agents over c10d and etcd, for sync workers (:class:`~aioelastic.store.BlockingTCPStore`)
and async ones (:class:`~aioelastic.store.TCPStore` through the agent's listener).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.conftest import BOUND, Launched, free_port, launched
from tests.agent.test_inplace_nodes import CONF, agent, consoles, rendezvous

pytestmark = pytest.mark.anyio

STORE_WORKER = str(Path(__file__).parent / "workers" / "store_worker.py")
SPARE_WORKER = str(Path(__file__).parent / "workers" / "spare_env.py")
EXAMPLE = str(Path(__file__).parents[2] / "examples" / "worker_store_plain.py")

__all__ = ["consoles", "rendezvous"]  # fixtures, used by name


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


def reports(text: str) -> dict[int, dict[int, tuple[int, list[int], int]]]:
    """Generation -> rank -> (pid, the members' pids it read, keys in its store)."""
    found: dict[int, dict[int, tuple[int, list[int], int]]] = {}
    pattern = r"gen (\d+) rank (\d+) pid (\d+) size \d+ members ([\d,]+) keys (\d+)"
    for gen, rank, pid, members, keys in re.findall(pattern, text):
        read = [int(p) for p in members.split(",")]
        found.setdefault(int(gen), {})[int(rank)] = (int(pid), read, int(keys))
    return found


def check_each_generation_saw_its_members(text: str) -> dict[int, dict[int, int]]:
    """Every rank of every generation read exactly that generation's pids, rank by rank, from a
    store holding nothing else; return generation -> {rank: pid}."""
    worlds = {}
    for gen, ranks in reports(text).items():
        pids = [ranks[rank][0] for rank in sorted(ranks)]
        assert sorted(ranks) == list(range(len(ranks))), (gen, ranks)
        for rank, (_, read, keys) in ranks.items():
            assert read == pids, f"generation {gen} rank {rank} read {read}, its members {pids}"
            assert keys == len(pids), f"generation {gen}'s store holds {keys} keys"
        worlds[gen] = dict(enumerate(pids))
    return worlds


async def kill_the_victim(runs: list[Launched]) -> int:
    """Wait until one of ``runs`` names its victim (rank 1 may be on any node); kill -9 it."""
    found: list[int] = []
    async with anyio.create_task_group() as tg:

        async def watch(run: Launched) -> None:
            await run.out.wait_for("victim pid")
            found.append(int(re.findall(r"victim pid (\d+)", run.out.text)[0]))
            tg.cancel_scope.cancel()

        for run in runs:
            tg.start_soon(watch, run)
    os.kill(found[0], signal.SIGKILL)
    return found[0]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_one_node_each_generation_meets_in_its_own_store(mode: str, tmp_path: Path) -> None:
    """3 workers without torch on one node, one killed: both generations' stores held exactly
    their members, the survivors kept their pids."""
    finish = tmp_path / "finish"
    worker = [STORE_WORKER, "--exit-when", str(finish), "--kill-rank", "1"]
    if mode == "async":
        worker.append("--async")
    argv = ["--standalone", "--recovery", "in-place", "--nproc-per-node", "3", *worker]
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as run:
            for rank in range(3):  # each reported (a wait of a world that ended would not)
                await run.out.wait_for(f"gen 1 rank {rank} pid")
            victim = await kill_the_victim([run])
            await run.out.wait_for("gen 2 rank 2 pid")
            await run.out.wait_for("gen 2 rank 1 pid")
            await run.out.wait_for("gen 2 rank 0 pid")
            finish.touch()
            status = await run.wait()
    assert status == 0, run
    worlds = check_each_generation_saw_its_members(run.out.text)
    assert set(worlds) == {1, 2}
    assert worlds[1][1] == victim != worlds[2][1]
    assert [worlds[1][r] for r in (0, 2)] == [worlds[2][r] for r in (0, 2)]
    assert "restarting" not in run.err.text


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_three_nodes_each_generation_meets_in_its_own_store(
    mode: str, rendezvous: list[str], tmp_path: Path
) -> None:
    """Three agents (c10d, etcd), one worker each, without torch: the stores reached through
    each agent's listener hold exactly each generation's members, across a kill -9."""
    finish = tmp_path / "finish"
    worker = [STORE_WORKER, "--exit-when", str(finish), "--kill-rank", "1"]
    if mode == "async":
        worker.append("--async")
    argv = [
        "--nnodes", "2:3", "--nproc-per-node", "1", *rendezvous, "--rdzv-conf", CONF,
        "--recovery", "in-place", *worker,
    ]  # fmt: skip
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
            runs = [a, b, c]
            for run in runs:
                await run.out.wait_for("size 3 members")
            victim = await kill_the_victim(runs)
            for run in runs:
                await run.out.wait_for("gen 2 rank")
            finish.touch()
            statuses = [await run.wait() for run in runs]
    assert statuses == [0, 0, 0], runs
    text = "".join(run.out.text for run in runs)
    worlds = check_each_generation_saw_its_members(text)
    assert set(worlds) == {1, 2}
    assert len(worlds[2]) == 3
    assert worlds[1][1] == victim != worlds[2][1]
    assert [worlds[1][r] for r in (0, 2)] == [worlds[2][r] for r in (0, 2)]
    for run in runs:
        assert "restarting" not in run.err.text


async def test_the_plain_worker_store_example_runs() -> None:
    """examples/worker_store_plain.py: two workers without torch meet in their world's store."""
    argv = ["--standalone", "--recovery", "in-place", "--nproc-per-node", "2", EXAMPLE]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 0, run
    assert run.out.text.count("all 2 ranks of generation 1 checked in") == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_under_restart_recovery_the_world_store_is_the_agents(
    mode: str, tmp_path: Path
) -> None:
    """Without in-place recovery, a worker without torch reaches the agent's store (the
    loopback listener of TORCHELASTIC_USE_AGENT_STORE) through world.store as well."""
    finish = tmp_path / "finish"
    finish.touch()
    worker = [STORE_WORKER, "--exit-when", str(finish), *(["--async"] if mode == "async" else [])]
    with anyio.fail_after(BOUND * 2):
        async with agent("--standalone", "--nproc-per-node", "2", *worker) as run:
            status = await run.wait()
    assert status == 0, run
    assert set(check_each_generation_saw_its_members(run.out.text)) == {1}


async def test_a_spare_claims_no_rank_until_it_is_placed(tmp_path: Path) -> None:
    """A spare's RANK/LOCAL_RANK/ROLE_RANK say -1 and its console lines "spare" until it takes
    a rank; then its environment and its console prefix say that rank. Its log files are its
    own, not slot 0's."""
    finish = tmp_path / "finish"
    argv = [
        "--standalone", "--recovery", "in-place", "--nproc-per-node", "2", "--spares", "1",
        "--tee", "3", "--log-dir", str(tmp_path / "logs"),
        SPARE_WORKER, "--exit-when", str(finish),
    ]  # fmt: skip
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as run:
            await run.out.wait_for("gen 2 rank 1 pid")
            finish.touch()
            status = await run.wait()
    assert status == 0, run
    spare = int(re.findall(r"started a spare worker: pid (\d+)", run.err.text)[0])
    unplaced = "RANK=-1 LOCAL_RANK=-1 ROLE_RANK=-1 AIOELASTIC_SPARE=1"
    assert f"[spare]: asking pid {spare} {unplaced}" in run.out.text
    placed = "RANK=1 LOCAL_RANK=1 ROLE_RANK=1 AIOELASTIC_SPARE=-"
    assert f"[1]: gen 2 rank 1 pid {spare} {placed}" in run.out.text
    assert "[0]: asking pid" in run.out.text  # the others as before
    [attempt] = (tmp_path / "logs").glob("*/attempt_0")
    spare_logs = [p.read_text() for p in attempt.glob("spare.*/stdout.log")]
    assert any(f"asking pid {spare} {unplaced}" in text for text in spare_logs)
    assert f"asking pid {spare}" not in (attempt / "0" / "stdout.log").read_text()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_wait_for_a_dead_peer_ends_with_its_world(mode: str, tmp_path: Path) -> None:
    """Rank 1 dies before writing its key; the others, blocked in multi_get for it (whose
    timeout, half of --recovery-timeout, is far beyond this test's bound), leave generation 1
    when it ends and meet the replacement in generation 2, in their processes."""
    finish = tmp_path / "finish"
    argv = [
        "--standalone", "--recovery", "in-place", "--recovery-timeout", "1200",
        "--nproc-per-node", "3", STORE_WORKER, "--exit-when", str(finish), "--die-early", "1",
        *(["--async"] if mode == "async" else []),
    ]  # fmt: skip
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as run:
            for rank in range(3):
                await run.out.wait_for(f"gen 2 rank {rank} pid")
            finish.touch()
            status = await run.wait()
    assert status == 0, run
    worlds = check_each_generation_saw_its_members(run.out.text)
    assert set(worlds) == {2}  # generation 1 never completed its check-in
    early = int(re.findall(r"dying early pid (\d+)", run.out.text)[0])
    survivors = set(re.findall(r"asking pid (\d+)", run.out.text)) - {str(early)}
    assert {str(worlds[2][r]) for r in (0, 2)} <= survivors


async def test_with_an_exposed_agent_store_both_nodes_meet_in_it(tmp_path: Path) -> None:
    """--expose-torch-store over c10d: workers without torch on both nodes reach group rank 0's
    exposed listener with our protocol and meet in one generation's keys."""
    finish = tmp_path / "finish"
    finish.touch()
    argv = [
        "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=exposed-plain",
        "--rdzv-conf=last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5",
        "--expose-torch-store", "--local-addr=127.0.0.1",
        STORE_WORKER, "--exit-when", str(finish),
    ]  # fmt: skip
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as first, agent(*argv) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    worlds = check_each_generation_saw_its_members(first.out.text + second.out.text)
    assert [len(members) for members in worlds.values()] == [2]
