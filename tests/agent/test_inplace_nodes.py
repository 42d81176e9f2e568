"""``--recovery in-place`` across nodes: three real agents over c10d and over a real etcd.

The workers are plain Python (``workers/inplace_plain.py``); their lines say each world's
generation, rank, pid and size. The c10d store is served by its own process, so an agent's
death does not take the job's store with it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic._launcher.cli_status import fetch_status, open_store
from aioelastic.agent._generations import (
    Begin,
    LogEntry,
    NodeLost,
    NodeSpec,
    decode_entry,
    encode_entry,
)
from aioelastic.agent._recovery import NodeRecord, plan_epoch
from aioelastic.rendezvous._status import GenerationStatus
from aioelastic.store import PrefixStore
from tests.agent.conftest import BOUND, Launched, free_port, launched, wait_gone
from tests.agent.test_inplace import TORCH_WORKER, check_every_sum, members

pytestmark = pytest.mark.anyio

PLAIN_WORKER = str(Path(__file__).parent / "workers" / "inplace_plain.py")
CONF = "last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5,close_timeout=2"


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


@pytest.fixture(params=["c10d", pytest.param("etcd", marks=pytest.mark.etcd)])
async def rendezvous(request: pytest.FixtureRequest) -> AsyncIterator[list[str]]:
    """The rendezvous flags of a fresh job: a c10d store process, or the session's etcd."""
    run_id = f"inplace-{uuid.uuid4().hex[:8]}"
    if request.param == "etcd":
        etcd = request.getfixturevalue("etcd_server")
        yield ["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints, "--rdzv-id", run_id]
        return
    port = free_port()
    async with launched("--port", str(port), command="store-server") as store:
        await store.out.wait_for("listening")
        yield [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
        ]


_RUNS: list[Launched] = []


@contextlib.asynccontextmanager
async def agent(*argv: str) -> AsyncIterator[Launched]:
    """An ``aioelastic run`` agent whose consoles are shown if the test fails."""
    async with launched(*argv) as run:
        _RUNS.append(run)
        yield run


@pytest.fixture(autouse=True)
def consoles() -> Iterator[None]:
    """Print every agent's consoles after the test (pytest shows them when it failed)."""
    _RUNS.clear()
    yield
    for index, run in enumerate(_RUNS):
        print(f"--- agent {index} stderr\n{run.err.text}\n--- agent {index} stdout\n{run.out.text}")


def worlds(text: str) -> dict[int, dict[int, int]]:
    """Generation -> {rank: pid}, from every worker's lines."""
    found: dict[int, dict[int, int]] = {}
    for gen, rank, pid in re.findall(r"gen (\d+) rank (\d+) pid (\d+)", text):
        found.setdefault(int(gen), {})[int(rank)] = int(pid)
    return found


async def shown_worlds(rendezvous: list[str], *, nodes: int) -> tuple[GenerationStatus, ...]:
    """What ``aioelastic status`` shows once every one of ``nodes`` nodes shows one running
    generation of ``nodes`` workers (each agent publishes each change right after it)."""
    flag = dict(zip(rendezvous[::2], rendezvous[1::2], strict=True))
    while True:
        status = await fetch_status(
            flag["--rdzv-backend"], flag["--rdzv-endpoint"], flag["--rdzv-id"], {}, 10.0
        )
        worlds = status.generations
        if (
            len(worlds) == nodes
            and all(w.phase == "running" and len(w.pids) == nodes for w in worlds)
            and len({w.generation for w in worlds}) == 1
        ):
            return worlds


def job_argv(
    rendezvous: list[str],
    finish: Path,
    *options: str,
    worker: tuple[str, ...] = (),
    conf: str = CONF,
) -> list[str]:
    """One agent (with ``options``) of a 2:3-node in-place job, one plain worker per node
    (with ``worker`` options) until ``finish`` exists."""
    return [
        "--nnodes", "2:3", "--nproc-per-node", "1", *rendezvous, "--rdzv-conf", conf,
        "--recovery", "in-place", *options, PLAIN_WORKER, "--exit-when", str(finish), *worker,
    ]  # fmt: skip


def sized(text: str, size: int) -> dict[int, int]:
    """The {rank: pid} of the last generation of ``size`` workers in ``text``."""
    found = [m for _, m in sorted(worlds(text).items()) if len(m) == size]
    assert found, f"no generation of {size} in {text!r}"
    return found[-1]


async def test_a_node_lost_leaves_the_others_training_in_a_smaller_world(
    rendezvous: list[str], tmp_path: Path
) -> None:
    """One of three agents is SIGKILLed: the other two nodes' workers go on in a world of 2,
    in the same processes (no restart), and finish. The node that saw the heartbeat go logs
    the loss at once: the world of 2 comes before the survivors' next round (which waits
    ``last_call_timeout=3`` for more nodes)."""
    finish = tmp_path / "finish"
    argv = job_argv(
        rendezvous, finish, conf=CONF.replace("last_call_timeout=0.5", "last_call_timeout=3")
    )
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
            for run in (a, b, c):
                await run.out.wait_for("size 3")
            before = sized(a.out.text + b.out.text + c.out.text, 3)
            c.send_signal(signal.SIGKILL)
            for run in (a, b):
                await run.out.wait_for("size 2")
            finish.touch()
            statuses = [await a.wait(), await b.wait()]
        for pid in re.findall(r"asking pid (\d+)", c.out.text):
            await wait_gone(int(pid))  # the killed agent's worker died with it
    assert statuses == [0, 0], (a, b)
    after = sized(a.out.text + b.out.text, 2)
    assert set(after) == {0, 1}
    assert set(after.values()) < set(before.values())  # the survivors' own processes
    for run in (a, b):
        assert "restarting" not in run.err.text
        assert "done pid" in run.out.text
        assert run.out.text.count("asking pid") == 1  # one worker process per node, ever
        assert "was lost" in run.err.text
        smaller = re.search(r"generation \d+: world size 2 \(node \d+ was lost\)", run.err.text)
        assert smaller is not None
        next_round = run.err.text.find("of 2, world size 2")
        assert next_round == -1 or smaller.start() < next_round, run.err.text


async def test_a_node_stopped_by_sigterm_leaves_the_world_at_once(
    rendezvous: list[str], tmp_path: Path
) -> None:
    """One of three agents gets SIGTERM: it logs its own leaving before its worker stops, so
    the others' world of 2 says "node N left" (not "was lost", which would mean they waited
    out its heartbeat), in their own processes."""
    finish = tmp_path / "finish"
    argv = job_argv(rendezvous, finish)
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
            for run in (a, b, c):
                await run.out.wait_for("size 3")
            before = sized(a.out.text + b.out.text + c.out.text, 3)
            c.send_signal(signal.SIGTERM)
            for run in (a, b):
                await run.out.wait_for("size 2")
            finish.touch()
            statuses = [await a.wait(), await b.wait(), await c.wait()]
    assert statuses[:2] == [0, 0], (a, b)
    assert statuses[2] == 128 + signal.SIGTERM, c
    after = sized(a.out.text + b.out.text, 2)
    assert set(after.values()) < set(before.values())
    for run in (a, b):
        assert re.search(r"generation \d+: world size 2 \(node \d+ left\)", run.err.text), run
        assert "was lost" not in run.err.text
        assert "restarting" not in run.err.text


async def log_the_loss_of_a_live_node(rendezvous: list[str]) -> int:
    """Append to the running epoch's generation log the loss of one of its nodes, as a node
    does that completed a round the other missed; return that node's id."""
    flag = dict(zip(rendezvous[::2], rendezvous[1::2], strict=True))
    run_id = flag["--rdzv-id"]
    async with open_store(
        flag["--rdzv-backend"], flag["--rdzv-endpoint"], run_id, {}, 10.0
    ) as store:
        job = PrefixStore(f"rdzv/{run_id}", store)
        keys = (await job.get_prefix("aioelastic/inplace/")).items
        epoch = max(int(key.split("/")[2]) for key in keys)
        log = PrefixStore(f"aioelastic/inplace/{epoch}/log", job)
        begin = decode_entry(await log.get("0")).event
        assert isinstance(begin, Begin)
        node = max(begin.nodes)
        entry, index = encode_entry(LogEntry(NodeLost(node), by="the test")), 1
        while await log.compare_set(str(index), b"", entry) != entry:
            index += 1
    return node


async def test_a_node_taken_for_lost_while_it_runs_stops_its_worker_and_joins_again(
    rendezvous: list[str], tmp_path: Path
) -> None:
    """The job takes a live node for lost (as when it misses a round; here the test logs the
    loss): that node's agent stops its worker, whose rank the others gave away, and joins
    again without a restart; the others keep their processes and the world grows back to 3."""
    finish = tmp_path / "finish"
    argv = job_argv(rendezvous, finish)
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
            runs = (a, b, c)
            for run in runs:
                await run.out.wait_for("size 3")
            before = sized(a.out.text + b.out.text + c.out.text, 3)
            node = await log_the_loss_of_a_live_node(rendezvous)
            for run in runs:
                await run.out.wait_for("size 3", count=2)  # back in a world of 3
            finish.touch()
            statuses = [await run.wait() for run in runs]
    assert statuses == [0, 0, 0], runs
    told = [
        run for run in runs if f"took this node for lost (node {node} was lost)" in run.err.text
    ]
    assert len(told) == 1, runs
    victim = told[0]
    old, new = (int(pid) for pid in re.findall(r"asking pid (\d+)", victim.out.text))
    await wait_gone(old)
    after = sized(a.out.text + b.out.text + c.out.text, 3)
    assert set(before.values()) - set(after.values()) == {old}
    assert set(after.values()) - set(before.values()) == {new}
    for run in runs:
        assert "restarting" not in run.err.text


async def test_a_node_joining_scales_up_in_place(rendezvous: list[str], tmp_path: Path) -> None:
    """A third agent joins a running 2-node job: the job goes on as a world of 3 with the first
    two nodes' workers in their processes, and the newcomer's worker fresh."""
    finish = tmp_path / "finish"
    argv = job_argv(rendezvous, finish)
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as a, agent(*argv) as b:
            for run in (a, b):
                await run.out.wait_for("size 2")
            before = sized(a.out.text + b.out.text, 2)
            async with agent(*argv) as c:
                for run in (a, b, c):
                    await run.out.wait_for("size 3")
                shown = await shown_worlds(rendezvous, nodes=3)
                finish.touch()
                statuses = [await a.wait(), await b.wait(), await c.wait()]
    assert statuses == [0, 0, 0], (a, b, c)
    after = sized(a.out.text + b.out.text + c.out.text, 3)
    assert set(after) == {0, 1, 2}
    assert set(before.values()) < set(after.values())
    assert [after[rank] for rank in (0, 1)] == [before[rank] for rank in (0, 1)]
    assert {world.pids for world in shown} == {tuple(after[rank] for rank in (0, 1, 2))}
    for run in (a, b):
        assert "restarting" not in run.err.text
        assert run.out.text.count("asking pid") == 1


def records(*nodes: tuple[int, int]) -> list[NodeRecord]:
    """Records of nodes given as (node, epoch), one worker each, last generation = node."""
    return [NodeRecord(node, NodeSpec(1), epoch, node) for node, epoch in nodes]


def test_a_round_where_nobody_runs_an_epoch_begins_one_alike_for_everyone() -> None:
    """No node runs workers: each begins epoch <round> with every node, numbers going on."""
    plans = [plan_epoch(node, records((1, 0), (4, 0)), 7) for node in (1, 4)]
    assert plans[0] == plans[1]
    assert plans[0].action == "begin"
    assert plans[0].epoch == 7
    assert plans[0].begin == Begin({1: NodeSpec(1), 4: NodeSpec(1)}, first_generation=5)


@pytest.mark.parametrize(
    ("node", "action", "epoch"),
    [(1, "stay", 5), (2, "join", 5), (3, "leave", 3)],
)
def test_the_newest_live_epoch_goes_on(node: int, action: str, epoch: int) -> None:
    """Its nodes stay, nodes without one join it, a node of an older one leaves that one."""
    plan = plan_epoch(node, records((1, 5), (2, 0), (3, 3)), 9)
    assert (plan.action, plan.epoch, plan.members) == (action, epoch, frozenset({1, 2, 3}))


def test_a_bad_node_record_is_an_error_that_shows_it() -> None:
    """A record that does not decode names its bytes."""
    with pytest.raises(ValueError, match=r"bad in-place node record b'\[1, 2\]'"):
        NodeRecord.decode(b"[1, 2]")
    record = NodeRecord(3, NodeSpec(2, 1), 4, 6)
    assert NodeRecord.decode(record.encode()) == record


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_gloo_survivors_of_a_lost_node_train_on_in_a_smaller_world() -> None:
    """Three gloo workers on three nodes; a node is lost mid-training: the other two leave
    their broken collective, form a world of 2 in their processes, and every step's all_reduce
    sums exactly its generation's members."""
    # last_call_timeout=3: the first round waits for the third agent (starting torch workers
    # on a loaded machine), else two nodes could train to the end before it is in.
    port = free_port()
    async with launched("--port", str(port), command="store-server") as store:
        await store.out.wait_for("listening")
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        argv = [
            "--nnodes", "2:3", "--nproc-per-node", "1", *rdzv, "--rdzv-id", "gloo-nodes",
            "--rdzv-conf", CONF.replace("last_call_timeout=0.5", "last_call_timeout=3"),
            "--recovery", "in-place",
            TORCH_WORKER, "--steps", "100",
        ]  # fmt: skip
        with anyio.fail_after(BOUND * 3):
            async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
                await c.out.wait_for("step 3 sum")
                c.send_signal(signal.SIGKILL)
                statuses = [await a.wait(), await b.wait()]
    assert statuses == [0, 0], (a, b)
    text = a.out.text + b.out.text + c.out.text
    first = members(text, 1)
    survivors = {pid for pid in first.values() if f"done pid {pid}" in text}
    assert len(first) == 3
    assert len(survivors) == 2
    last = max(int(gen) for gen in re.findall(r"gen (\d+) rank \d+ of", text))
    assert set(members(text, last).values()) == survivors  # the same processes, no restart
    steps = check_every_sum(text)
    assert steps[1] > 0
    assert steps[last] > 0
    for run in (a, b):
        assert "restarting" not in run.err.text


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_a_hung_peer_on_another_node_is_evicted_and_the_others_train_on(
    tmp_path: Path,
) -> None:
    """Three gloo workers on three nodes; rank 2 hangs (SIGSTOP: its agent lives on, so no node
    is lost). The others' collectives time out (the world's timeout, 10 s: also what their next
    process group waits for the replacement to start and import torch), both ask, and the
    generation log's verdict takes the silent rank for hung on every node alike: its node kills
    it and starts a replacement, and the survivors go on in their processes, with no restart
    (before, each waited --recovery-timeout, was told its error was its own, and failed)."""
    port = free_port()
    async with launched("--port", str(port), command="store-server") as store:
        await store.out.wait_for("listening")
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        argv = [
            "--nnodes", "3", "--nproc-per-node", "1", *rdzv, "--rdzv-id", "hung-nodes",
            "--rdzv-conf", CONF, "--recovery", "in-place", "--recovery-timeout", "20",
            TORCH_WORKER, "--steps", "12", "--stop-at", "3", "--marker", str(tmp_path / "m"),
        ]  # fmt: skip
        with anyio.fail_after(BOUND * 3):
            async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
                statuses = [await a.wait(), await b.wait(), await c.wait()]
    assert statuses == [0, 0, 0], (a, b, c)
    text = a.out.text + b.out.text + c.out.text
    errors = a.err.text + b.err.text + c.err.text
    first, second = members(text, 1), members(text, 2)
    assert re.search(
        rf"evicted rank 2 \(pid {first[2]}\): 2 of 3 ranks' collectives failed in generation 1",
        errors,
    ), errors
    assert [second[r] for r in (0, 1)] == [first[r] for r in (0, 1)]
    assert second[2] != first[2]
    assert "restarting the worker group" not in errors
    assert "failed: exit code" not in errors  # nobody was told its error was its own
    steps = check_every_sum(text)
    assert steps[2] > 0


async def test_a_worker_failure_on_one_node_moves_every_node_to_the_next_generation(
    rendezvous: list[str], tmp_path: Path
) -> None:
    """A worker on one of three nodes is killed: only it is replaced; the other nodes' workers
    enter the next generation in their processes, with their ranks."""
    finish = tmp_path / "finish"
    argv = job_argv(rendezvous, finish)
    with anyio.fail_after(BOUND * 2):
        async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
            for run in (a, b, c):
                await run.out.wait_for("size 3")
            victim = int(re.findall(r"asking pid (\d+)", b.out.text)[0])
            os.kill(victim, signal.SIGKILL)
            for run in (a, b, c):
                await run.out.wait_for("gen 2 rank")
            finish.touch()
            statuses = [await a.wait(), await b.wait(), await c.wait()]
    assert statuses == [0, 0, 0], (a, b, c)
    found = worlds(a.out.text + b.out.text + c.out.text)
    before, after = found[1], found[2]
    assert set(after) == {0, 1, 2}
    rank = next(r for r, pid in before.items() if pid == victim)
    assert after[rank] != victim
    assert {r: p for r, p in after.items() if r != rank} == {
        r: p for r, p in before.items() if r != rank
    }
    for run in (a, c):
        assert run.out.text.count("asking pid") == 1
    assert b.out.text.count("asking pid") == 2  # the replacement, on the failed worker's node
    for run in (a, b, c):
        assert "restarting" not in run.err.text


async def test_a_generation_across_nodes_that_does_not_form_falls_back_to_a_restart_of_all(
    tmp_path: Path,
) -> None:
    """The replacement hangs: after --recovery-timeout every agent falls back alike, restarts
    its workers (one restart each), and the job forms a new world of 3 and finishes."""
    port, finish, hang = free_port(), tmp_path / "finish", tmp_path / "hang"
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ladder"]
    options = ("--recovery-timeout", "4", "--max-restarts", "1")
    argv = job_argv(rdzv, finish, *options, worker=("--hang-once", str(hang)))
    async with launched("--port", str(port), command="store-server") as store:
        await store.out.wait_for("listening")
        with anyio.fail_after(BOUND * 2):
            async with agent(*argv) as a, agent(*argv) as b, agent(*argv) as c:
                for run in (a, b, c):
                    await run.out.wait_for("size 3")
                hang.write_text("")
                os.kill(int(re.findall(r"asking pid (\d+)", b.out.text)[0]), signal.SIGKILL)
                for run in (a, b, c):
                    await run.err.wait_for("restarting the worker group (1/1)")
                    await run.out.wait_for("size 3", count=2)
                finish.touch()
                statuses = [await a.wait(), await b.wait(), await c.wait()]
    assert statuses == [0, 0, 0], (a, b, c)
    for run in (a, b, c):
        assert "did not form within 4 s" in run.err.text
