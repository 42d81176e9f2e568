"""Stacks before the kill: real workers hang under a shared timer scope; the agent captures
every local rank before the watchdog reaps, and the reap happens whatever the capture met."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.agent import (
    AgentEvent,
    ElasticAgent,
    ForensicsSpec,
    HangReport,
    RunState,
    StacksCaptured,
    WorkerFailed,
    WorkerReaped,
    WorkerSpec,
)
from aioelastic.agent._forensics import find_py_spy
from aioelastic.agent._report import StackRecord
from aioelastic.agent._stack_requests import (
    RankStack,
    publish_incident,
    request_stacks,
    wait_for_incidents,
)
from aioelastic.agent._stacks import Place
from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aioelastic.store import MemoryStore
from tests.agent.conftest import BOUND, Console, free_port, launched

pytestmark = pytest.mark.anyio

HANG = str(Path(__file__).parent / "workers" / "hang.py")
EXAMPLE = Path(__file__).parents[2] / "examples" / "hang_forensics.py"


def line_of(code: str, path: str | Path = HANG) -> int:
    """The line of ``path`` (the hang worker) holding ``code``."""
    lines = Path(path).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if code in text)


STUCK = f"hang.py:{line_of('time.sleep(3600)')} stuck_in_load_batch"
WAITING = f"hang.py:{line_of('threading.Event().wait()')} wait_for_peer"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def py_spy() -> str:
    """py-spy, when it is installed and may attach to this user's processes."""
    path = find_py_spy("auto")
    if path is None:
        if os.environ.get("CI") == "true":  # the test extra installs it
            pytest.fail("py-spy is not installed under CI: is it in the test extra?")
        pytest.skip("py-spy is not installed (pip install 'aioelastic[test]')")
    code = "import time; print('up', flush=True); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as child:
        try:
            assert child.stdout is not None
            child.stdout.readline()  # attached before the interpreter is up, py-spy fails
            probe = subprocess.run([path, "dump", "--pid", str(child.pid)], capture_output=True)
        finally:
            child.kill()
    if probe.returncode != 0:
        pytest.skip(f"py-spy cannot attach here: {probe.stderr.decode()[-200:]}")
    return path


async def run_hang(
    tmp_path: Path, forensics: ForensicsSpec, *args: str, nproc: int = 3
) -> tuple[Any, list[AgentEvent], HangReport]:
    """Run the hang worker under an agent (one restart: the second attempt succeeds)."""
    ((result, events),) = await run_nodes(tmp_path, forensics, args, nproc=nproc)
    return result, events, report_of(events)


async def run_nodes(
    tmp_path: Path, forensics: ForensicsSpec, *node_args: Sequence[str], nproc: int = 3
) -> list[tuple[Any, list[AgentEvent]]]:
    """Run one agent of ``nproc`` hang workers per ``node_args`` (the workers' arguments on
    that node) in this loop, over a memory rendezvous; each run's result and events."""
    nodes = len(node_args)
    store = MemoryStore()
    barrier = str(tmp_path / "barrier.sock")
    outcomes: dict[int, tuple[Any, list[AgentEvent]]] = {}

    async def node(index: int) -> None:
        params = RendezvousParameters("memory", "forensics", "job", nodes, nodes, store=store)
        events: list[AgentEvent] = []
        async with get_rendezvous_handler(params) as handler:
            spec = WorkerSpec(
                sys.executable,
                handler,
                args=("-u", HANG, "--barrier", barrier, *node_args[index]),
                local_world_size=nproc,
                max_restarts=1,
                logs=_logs(tmp_path / f"node{index}"),
                forensics=forensics,
            )
            agent = ElasticAgent(spec, on_event=events.append, stdout=Console(), stderr=Console())
            outcomes[index] = (await agent.run(), events)

    with anyio.fail_after(BOUND * 2):
        async with (
            anyio.create_task_group() as tg,
            await anyio.create_unix_listener(barrier) as listener,
        ):
            tg.start_soon(serve_barrier, listener, nproc * nodes)
            async with anyio.create_task_group() as agents:
                for index in range(nodes):
                    agents.start_soon(node, index)
            tg.cancel_scope.cancel()
    return [outcomes[index] for index in range(nodes)]


def reports_of(events: list[AgentEvent]) -> list[HangReport]:
    """The hang reports a run emitted."""
    return [e.report for e in events if isinstance(e, StacksCaptured)]


def report_of(events: list[AgentEvent]) -> HangReport:
    """The one hang report a run emitted."""
    reports = reports_of(events)
    assert len(reports) == 1, events
    return reports[0]


async def serve_barrier(listener: Any, parties: int) -> None:
    """Release the first attempt's ``parties`` workers together (later ones never connect)."""
    waiting = []
    async with contextlib.AsyncExitStack() as stack:
        while len(waiting) < parties:
            stream = await stack.enter_async_context(await listener.accept())
            await stream.receive()
            waiting.append(stream)
        for stream in waiting:
            await stream.send(b"g")
        await anyio.sleep_forever()  # keeps the connections the peers wait on open


def _logs(tmp_path: Path) -> Any:
    from aioelastic.agent import LogSpec, Std

    return LogSpec(log_dir=str(tmp_path / "logs"), redirects=Std.ALL)  # error files kept there


def read(path: str) -> str:
    """A file's text (the run is over: nothing else waits on the loop)."""
    return Path(path).read_text()


def magic(path: str) -> bytes:
    """A file's first four bytes."""
    with open(path, "rb") as file:
        return file.read(4)


def reaped_ranks(events: list[AgentEvent]) -> list[int]:
    return sorted(e.rank for e in events if isinstance(e, WorkerReaped))


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """Busy processes competing for the CPUs while the block runs."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


async def test_every_rank_is_captured_by_py_spy_before_any_is_reaped(
    tmp_path: Path, py_spy: str
) -> None:
    """A shared scope expires on all ranks at once: all three stacks are taken, then all reaped;
    the report says where each main thread was and the files hold every thread."""
    result, events, report = await run_hang(
        tmp_path, ForensicsSpec(py_spy=py_spy), "--hang-rank", "1", "--threads", "8"
    )
    assert (result.state, result.restart_count) == (RunState.SUCCEEDED, 1)
    assert 1 in reaped_ranks(events)
    assert [(s.rank, s.method) for s in report.stacks] == [(i, "py-spy") for i in range(3)]
    assert report.summary == f"rank 1 stuck in {STUCK}; ranks 0 and 2 stuck in {WAITING}"
    assert report.suspects == (1,)
    stacks = Path(report.directory)
    assert (stacks.parents[2], stacks.parent.parent.name[:4], stacks.parts[-2:]) == (
        tmp_path / "node0" / "logs",
        "job_",
        ("attempt_0", "stacks"),
    )
    text = read(report.stacks[1].stack_file or "")
    assert text.count("Thread ") == 9
    assert "stuck_in_load_batch" in text
    assert json.loads(read(f"{report.directory}/hang.json"))["summary"] == report.summary


async def test_the_failure_carries_the_stack_and_the_error_file_keeps_torchs_layout(
    tmp_path: Path, py_spy: str
) -> None:
    """The reaped worker's failure names its stack file and the group summary; the error file
    the agent wrote for it is torch's layout with our fields beside."""
    _, events, report = await run_hang(
        tmp_path, ForensicsSpec(py_spy=py_spy), "--hang-rank", "0", nproc=1
    )
    failure = next(e.failure for e in events if isinstance(e, WorkerFailed))
    assert failure.stack is not None
    assert failure.hang == report
    assert failure.stack.stack_file == report.stacks[0].stack_file
    data = json.loads(read(failure.error_file))
    assert "stuck_in_load_batch" in data["message"]["extraInfo"]["py_callstack"]
    assert data["aioelastic"]["hang_summary"] == f"rank 0 stuck in {STUCK}"
    assert data["aioelastic"]["suspect_ranks"] == [0]
    assert failure.traceback is not None
    assert "stuck_in_load_batch" in failure.traceback


async def test_capture_under_load_still_gets_every_stack(tmp_path: Path, py_spy: str) -> None:
    """With busy processes competing for the CPUs, py-spy still captures every rank."""
    with cpu_load(4):
        result, events, report = await run_hang(
            tmp_path, ForensicsSpec(py_spy=py_spy, hook_timeout=30), "--hang-rank", "2"
        )
    assert result.state is RunState.SUCCEEDED
    assert 2 in reaped_ranks(events)
    assert report.suspects == (2,)
    assert [s.method for s in report.stacks] == ["py-spy"] * 3


async def test_without_py_spy_the_faulthandler_signal_gives_the_stacks(tmp_path: Path) -> None:
    """py-spy absent: the signal the worker's timer client registered dumps every thread."""
    result, events, report = await run_hang(
        tmp_path, ForensicsSpec(py_spy=None), "--hang-rank", "0"
    )
    assert result.state is RunState.SUCCEEDED
    assert 0 in reaped_ranks(events)
    assert [s.method for s in report.stacks] == ["faulthandler"] * 3
    assert report.summary == f"rank 0 stuck in {STUCK}; ranks 1 and 2 stuck in {WAITING}"
    assert all(s.reason == "py-spy is not installed" for s in report.stacks)


async def test_a_worker_ignoring_the_signal_is_reaped_with_the_reason(tmp_path: Path) -> None:
    """No py-spy and the worker ignores the signal: no stack, a reason saying so, the reap."""
    result, events, report = await run_hang(
        tmp_path, ForensicsSpec(py_spy=None), "--ignore-stack-signal", nproc=1
    )
    assert result.state is RunState.SUCCEEDED
    assert reaped_ranks(events) == [0]
    (stack,) = report.stacks
    assert (stack.method, stack.stack_file) == (None, None)
    assert stack.reason is not None
    assert "the worker wrote no stack within" in stack.reason
    assert report.summary == "rank 0: no stack"


async def test_a_worker_exiting_during_the_capture_ends_the_attempt(tmp_path: Path) -> None:
    """The worker dies while "py-spy" attaches (a stand-in that kills it): the capture says
    why there is no stack and the agent restarts the group as for a reap."""
    killer = tmp_path / "py-spy-killer"
    killer.write_text('#!/bin/sh\nkill -9 "$3"\necho "Error: process gone" >&2\nexit 1\n')
    killer.chmod(0o755)
    result, events, report = await run_hang(
        tmp_path, ForensicsSpec(py_spy=str(killer)), "--hang-rank", "0", nproc=1
    )
    assert (result.state, result.restart_count) == (RunState.SUCCEEDED, 1)
    (stack,) = report.stacks
    assert stack.method is None
    assert stack.reason is not None
    assert stack.reason.startswith("py-spy failed: Error: process gone")
    failed = [e.failure for e in events if isinstance(e, WorkerFailed)]
    assert [(f.rank, f.signal_name) for f in failed] == [(0, "SIGKILL")]


@pytest.mark.skipif(
    shutil.which("gcore") is None and os.environ.get("CI") != "true",
    reason="gdb's gcore is not installed (CI installs it)",
)
async def test_reap_core_dump_writes_a_core_beside_the_stacks(tmp_path: Path) -> None:
    """With core dumps on, the reaped worker's native core lands in the stacks directory."""
    _, _, report = await run_hang(
        tmp_path, ForensicsSpec(core_dump=True, py_spy=None), "--hang-rank", "0", nproc=1
    )
    (stack,) = report.stacks
    assert stack.core_file == f"{report.directory}/core.{stack.pid}", stack
    assert magic(stack.core_file) == b"\x7fELF"


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_torch_job_report_names_the_sleeping_rank_and_the_ranks_in_all_reduce(
    tmp_path: Path, py_spy: str
) -> None:
    """The example on two nodes (two agents over c10d, 2 + 1 gloo ranks): rank 2 sleeps inside
    the step while ranks 0 and 1 block in all_reduce; both nodes' failure reports name rank 2
    and its frame, and the others, on whichever node, as waiting in the collective."""
    port = free_port()
    common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    common += ["--rdzv-id", "gloo"]
    with anyio.fail_after(BOUND * 3):
        async with (
            launched(
                *common, "--nproc-per-node", "2", "--log-dir", str(tmp_path / "a"), str(EXAMPLE)
            ) as one,
            launched(
                *common, "--nproc-per-node", "1", "--log-dir", str(tmp_path / "b"), str(EXAMPLE)
            ) as two,
        ):
            statuses = [await one.wait(), await two.wait()]
    stuck = f"hang_forensics.py:{line_of('time.sleep(3600)', EXAMPLE)} load_batch"
    assert statuses == [1, 1], (one, two)
    for run in (one, two):
        assert f"  hang      : rank 2 stuck in {stuck}; ranks 0 and 1 waiting in all_reduce" in (
            run.err.text
        ), run
        assert "  suspects  : 2 (stacks in " in run.err.text


async def test_other_nodes_answer_with_their_ranks_stacks(tmp_path: Path) -> None:
    """Two agents of two ranks each: each report groups all four ranks, the other node's
    through the store, and suspects rank 3 alone."""
    args = ("--hang-rank", "3")
    runs = await run_nodes(tmp_path, ForensicsSpec(py_spy=None), args, args, nproc=2)
    for result, events in runs:
        report = report_of(events)
        assert result.state is RunState.SUCCEEDED
        assert report.summary == f"rank 3 stuck in {STUCK}; ranks 0-2 stuck in {WAITING}"
        assert report.suspects == (3,)
        assert [s.rank for s in report.stacks] == [0, 1, 2, 3]


async def test_a_node_whose_timer_expires_later_still_names_the_first_nodes_ranks(
    tmp_path: Path,
) -> None:
    """Node 1's step budget is longer: node 0 captures first but reaps only once node 1 has
    reported too, so node 1's report still has node 0's ranks (a reap there would have ended
    the round before node 1's timer expired)."""
    forensics = ForensicsSpec(py_spy=None, hook_timeout=BOUND / 4)  # a bound never reached
    runs = await run_nodes(
        tmp_path,
        forensics,
        ("--hang-rank", "3", "--budget", "0.5"),
        ("--hang-rank", "3", "--budget", "3"),
        nproc=2,
    )
    for result, events in runs:
        report = report_of(events)
        assert (result.state, result.restart_count) == (RunState.SUCCEEDED, 1)
        assert report.summary == f"rank 3 stuck in {STUCK}; ranks 0-2 stuck in {WAITING}"
        assert [s.method for s in report.stacks] == ["faulthandler"] * 4
    first, later = (report_of(events) for _, events in runs)
    assert first.scope_id == later.scope_id == "step"


async def test_a_node_whose_workers_never_time_out_costs_the_others_only_the_bound(
    tmp_path: Path,
) -> None:
    """Node 1's ranks hang without a timer: node 0 gets their stacks by asking, waits at most
    its bound for a report node 1 never makes, reaps and restarts (node 1 with it)."""
    once = tmp_path / "once"
    once.mkdir()
    runs = await run_nodes(
        tmp_path,
        ForensicsSpec(py_spy=None, hook_timeout=1),
        ("--hang-rank", "3"),
        ("--hang-rank", "3", "--budget", "0", "--once", str(once)),
        nproc=2,
    )
    (first, first_events), (other, other_events) = runs
    assert (first.state, first.restart_count) == (RunState.SUCCEEDED, 1)
    assert (other.state, other.restart_count) == (RunState.SUCCEEDED, 0)
    assert report_of(first_events).summary == (
        f"rank 3 stuck in {STUCK}; ranks 0-2 stuck in {WAITING}"
    )
    assert reaped_ranks(first_events) == [0, 1]
    assert reports_of(other_events) == []


async def test_status_stacks_groups_the_ranks_of_a_running_job(tmp_path: Path) -> None:
    """`aioelastic status --stacks` asks both agents of a live c10d job through the store:
    ranks 0 and 1 wait, rank 2 is stuck and suspected, whichever node each is on."""
    port = free_port()
    common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    common += ["--rdzv-id", "stacks", "--log-dir", str(tmp_path)]
    worker = [HANG, "--budget", "0", "--hang-rank", "2"]
    status_argv = ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "stacks", "--stacks"]
    with anyio.fail_after(BOUND * 2):
        async with (
            launched(*common, "--nproc-per-node", "2", "--node-rank", "0", *worker) as one,
            launched(*common, "--nproc-per-node", "1", "--node-rank", "1", *worker) as two,
        ):
            await one.out.wait_for("ready", 2)
            await two.out.wait_for("ready")
            async with launched(*status_argv, "--json", command="status") as status:
                assert await status.wait() == 0, status
    stacks = json.loads(status.out.text)["stacks"]
    assert stacks["summary"] == f"rank 2 stuck in {STUCK}; ranks 0 and 1 stuck in {WAITING}"
    assert stacks["suspects"] == [2]
    assert sorted(r["rank"] for r in stacks["ranks"]) == [0, 1, 2]
    assert sorted(r["node"] for r in stacks["ranks"]) in ([0, 0, 1], [0, 1, 1])
    assert all(r["stack_file"] for r in stacks["ranks"])


def test_reap_core_dump_flag_reaches_the_launch() -> None:
    """`aioelastic run --reap-core-dump` turns core dumps on; they are off by default."""
    from aioelastic._launcher.launch import config_from_args
    from aioelastic.cli import build_parser

    def config(*argv: str) -> Any:
        return config_from_args(build_parser().parse_args(["run", *argv]))

    assert config("--reap-core-dump", "train.py").reap_core_dump
    assert not config("train.py").reap_core_dump


def _stack(rank: int) -> RankStack:
    record = StackRecord(rank=rank, pid=100 + rank, method="py-spy", stack_file=f"/s/{rank}")
    return RankStack(record, Place(True, "all_reduce"))


async def test_a_published_part_of_the_hang_answers_without_asking() -> None:
    """A node that published its part of the round's hang is answered from the store (it may
    have left): no request is made; a live request still goes to the nodes that did not."""
    store = MemoryStore()
    await publish_incident(store, 1, [_stack(2)])
    answers, silent = await request_stacks(
        store, nodes=2, timeout=BOUND, own_node=0, published=True
    )
    assert ([s.record.rank for s in answers[1]], silent) == ([2], [])
    assert await store.check(["aioelastic/stacks/requests"]) is False
    answers, silent = await request_stacks(store, nodes=3, timeout=0.01, own_node=0, published=True)
    assert (sorted(answers), silent) == ([1], [2])


async def test_waiting_for_the_rounds_parts_ends_when_the_last_is_published() -> None:
    """The wait before a reap returns once every other node published (nodes that did not
    answer are not waited for), and names those that did not publish in time."""
    store = MemoryStore()
    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_incident, store, 2, [_stack(3)])
        missing = await wait_for_incidents(store, nodes=4, own_node=0, skip=(1, 3), timeout=BOUND)
    assert missing == []
    missing = await wait_for_incidents(store, nodes=4, own_node=0, timeout=0.01)
    assert missing == [1, 3]
