"""ElasticAgent with real worker processes on one node (in-process rendezvous)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.agent import (
    AgentEvent,
    AgentStatistics,
    ElasticAgent,
    GroupRestarting,
    LogDirectoryCreated,
    LogSpec,
    MembershipChanged,
    RunResult,
    RunState,
    Std,
    WorkerFailed,
    WorkerReaped,
    WorkerSpec,
    WorkersStarted,
    WorkersStopped,
)
from aioelastic.rendezvous import RendezvousHandler, RendezvousParameters, get_rendezvous_handler
from aioelastic.store import MemoryStore
from tests.agent.conftest import (
    BOUND,
    Console,
    guardian_of,
    pids_in,
    python_worker,
    reaped,
    wait_gone,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[pytest.param(("asyncio", {}), id="asyncio"), pytest.param(("trio", {}), id="trio")]
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The agent embeds in asyncio and trio programs (the launcher tests cover uvloop)."""
    return request.param


@pytest.fixture
async def handler() -> AsyncIterator[RendezvousHandler]:
    """A single-node in-process rendezvous (the memory backend, its own store)."""
    async with get_rendezvous_handler(handler_params("job")) as handler:
        yield handler


def handler_params(run_id: str) -> RendezvousParameters:
    """A single-node in-process rendezvous of ``run_id`` on a store of its own."""
    return RendezvousParameters(
        "memory", "agent-tests", run_id, min_nodes=1, max_nodes=1, store=MemoryStore()
    )


def spec_for(handler: Any, *args: str, **options: Any) -> WorkerSpec:
    entrypoint, worker_args = python_worker(*args)
    options.setdefault("local_world_size", 2)
    return WorkerSpec(entrypoint, handler, args=worker_args, **options)


def records(out: Path) -> list[dict[str, str]]:
    """The environments the workers recorded, ordered by attempt then rank."""
    found = [json.loads(p.read_text()) for p in out.iterdir()]
    return sorted(found, key=lambda e: (int(e["TORCHELASTIC_RESTART_COUNT"]), int(e["RANK"])))


async def run_agent(spec: WorkerSpec, **options: Any) -> tuple[Any, list[AgentEvent]]:
    events: list[AgentEvent] = []
    options.setdefault("stdout", Console())
    options.setdefault("stderr", Console())
    agent = ElasticAgent(spec, on_event=events.append, **options)
    with anyio.fail_after(BOUND):
        result = await agent.run()
    return result, events


def run_log_dir(events: list[AgentEvent], log_dir: Path, run_id: str) -> Path:
    """The run's own log directory, as announced: ``<log_dir>/<run_id>_<random>``."""
    [path] = [Path(e.path) for e in events if isinstance(e, LogDirectoryCreated)]
    assert path.parent == log_dir
    assert path.name.startswith(f"{run_id}_")
    return path


async def test_a_second_run_with_the_same_id_gets_its_own_log_directory(
    handler: Any, tmp_path: Path
) -> None:
    """Reusing --log-dir and the run id never appends to the last run's files (torchrun's)."""
    logs = LogSpec(log_dir=str(tmp_path), redirects=Std.OUT)
    _, first = await run_agent(spec_for(handler, logs=logs, max_restarts=0))
    async with get_rendezvous_handler(handler_params(handler.get_run_id())) as again:
        _, second = await run_agent(spec_for(again, logs=logs, max_restarts=0))
    dirs = {run_log_dir(events, tmp_path, handler.get_run_id()) for events in (first, second)}
    assert len(dirs) == 2
    for run_dir in dirs:
        assert (run_dir / "attempt_0" / "0" / "stdout.log").read_text().count("done rank=0") == 1


async def test_workers_get_torch_environment(handler: Any, tmp_path: Path) -> None:
    """Each worker sees torch's variables with its own ranks and the watchdog's FIFO."""
    result, _ = await run_agent(spec_for(handler, "--out", str(tmp_path), max_restarts=0))
    envs = records(tmp_path)
    assert result.state is RunState.SUCCEEDED
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]
    for env in envs:
        assert env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0"
        assert env["GROUP_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "default"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == handler.get_run_id()
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the agent's loopback store
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"-{env['LOCAL_RANK']}.json")
        assert Path(env["TORCHELASTIC_TIMER_FILE"]).name == "watchdog"


async def test_watchdog_can_be_turned_off_by_environment(
    handler: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TORCHELASTIC_ENABLE_FILE_TIMER=0 runs without a watchdog, so no timer file is given."""
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "0")
    await run_agent(spec_for(handler, "--out", str(tmp_path), local_world_size=1))
    assert "TORCHELASTIC_TIMER_FILE" not in records(tmp_path)[0]


async def test_failed_worker_restarts_the_group(handler: Any, tmp_path: Path) -> None:
    """A worker exiting 1 on the first attempt costs one restart; RESTART_COUNT becomes 1."""
    spec = spec_for(handler, "--out", str(tmp_path), "--fail-rank", "1", max_restarts=3)
    result, events = await run_agent(spec)
    second = [e for e in records(tmp_path) if e["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert (result.state, result.restart_count, result.returncodes) == (
        RunState.SUCCEEDED,
        1,
        {0: 0, 1: 0},
    )
    assert [e["RANK"] for e in second] == ["0", "1"]
    assert [e for e in events if isinstance(e, GroupRestarting)] == [GroupRestarting(1, 3)]
    failed = [e.failure for e in events if isinstance(e, WorkerFailed)]
    assert [(f.rank, f.returncode, f.message) for f in failed] == [
        (1, 1, "RuntimeError: rank 1 fails on attempt 0")
    ]


async def test_restarts_exhausted_fails_and_closes_the_rendezvous(handler: Any) -> None:
    """When restarts run out the run fails with the worker's error and the job is closed."""
    spec = spec_for(handler, "--fail-rank", "0", "--fail-attempts", "9", max_restarts=1)
    result, _ = await run_agent(spec)
    failure = result.first_failure
    assert (result.state, result.exit_status, result.restart_count) == (RunState.FAILED, 1, 1)
    assert failure is not None
    assert (failure.rank, failure.returncode) == (0, 1)
    assert failure.message == "RuntimeError: rank 0 fails on attempt 1"
    assert failure.traceback is not None
    assert 'raise RuntimeError(f"rank {rank} fails' in failure.traceback
    assert result.reason == "restarts exhausted (1 allowed)"
    assert await handler.is_closed()


async def test_hung_worker_is_reaped_and_the_group_restarts(handler: Any) -> None:
    """A worker stuck past its timer is killed by the watchdog; the restarted group finishes."""
    spec = spec_for(handler, "--hang-rank", "1", "--budget", "0.3", max_restarts=1)
    result, events = await run_agent(spec)
    reaped = [e for e in events if isinstance(e, WorkerReaped)]
    failed = [e.failure for e in events if isinstance(e, WorkerFailed)]
    assert (result.state, result.restart_count) == (RunState.SUCCEEDED, 1)
    assert [(e.rank, e.scope_id, e.signal) for e in reaped] == [(1, "hung-step", signal.SIGKILL)]
    assert [(f.rank, f.reaped_scope, f.signal_name) for f in failed] == [
        (1, "hung-step", "SIGKILL")
    ]


async def test_output_is_prefixed_with_the_rank(handler: Any) -> None:
    """Every worker line reaches the console prefixed with the worker's global rank."""
    out = Console()
    await run_agent(spec_for(handler, max_restarts=0), stdout=out)
    assert "[0]: done rank=0 attempt=0 nodes=1\n" in out.text
    assert "[1]: done rank=1 attempt=0 nodes=1\n" in out.text


async def test_redirects_send_output_to_files(handler: Any, tmp_path: Path) -> None:
    """With redirects, stdout goes to <log_dir>/<run>_*/attempt_0/<rank>/stdout.log only."""
    out = Console()
    logs = LogSpec(log_dir=str(tmp_path), redirects=Std.OUT, local_ranks_filter=None)
    _, events = await run_agent(spec_for(handler, logs=logs, max_restarts=0), stdout=out)
    log = run_log_dir(events, tmp_path, handler.get_run_id()) / "attempt_0" / "1" / "stdout.log"
    assert "done rank=1 attempt=0" in log.read_text()
    assert out.text == ""


async def test_stopping_leaves_no_worker_or_grandchild(handler: Any) -> None:
    """A stop request ends the workers and their grandchildren; the run reports the signal."""
    out = Console()
    agent = ElasticAgent(spec_for(handler, "--grandchild"), stdout=out)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run)
            await out.wait_for("pids", count=2)
            agent.request_stop(signal.SIGTERM)
        for pid in pids_in(out.text):
            await wait_gone(pid)
    assert agent.statistics().state == "stopped"


async def test_workers_ignoring_sigterm_are_killed_after_the_timeout(handler: Any) -> None:
    """Workers that ignore the forwarded signal get SIGKILL once shutdown_timeout passes."""
    out = Console()
    events: list[AgentEvent] = []
    spec = spec_for(handler, "--ignore-sigterm", shutdown_timeout=0.2)
    agent = ElasticAgent(spec, stdout=out, on_event=events.append)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run)
            await out.wait_for("pids", count=2)
            agent.request_stop(signal.SIGTERM)
    result = await agent.wait()
    stopped = [e for e in events if isinstance(e, WorkersStopped)]
    assert (result.state, result.exit_status) == (RunState.STOPPED, 128 + signal.SIGTERM)
    assert [(e.signal, e.killed) for e in stopped] == [(signal.SIGTERM, 2)]


async def test_async_with_runs_in_the_background_and_stops_on_exit(handler: Any) -> None:
    """``async with agent`` runs it in the background; leaving the block stops the workers."""
    out = Console()
    with anyio.fail_after(BOUND):
        async with ElasticAgent(spec_for(handler, "--grandchild"), stdout=out) as agent:
            await out.wait_for("pids", count=2)
        result = await agent.wait()
        for pid in pids_in(out.text):
            await wait_gone(pid)
    assert result.state is RunState.STOPPED


async def run_into(
    results: dict[str, RunResult], name: str, spec: WorkerSpec, on_event: Any = None
) -> None:
    """Run an agent for ``spec`` to its end (one of several in a test); keep its result."""
    agent = ElasticAgent(spec, stdout=Console(), stderr=Console(), on_event=on_event)
    results[name] = await agent.run()


async def test_a_joining_node_re_rendezvouses_without_costing_a_restart(tmp_path: Path) -> None:
    """Agents in one loop: a second node joining makes the first re-rendezvous for free."""
    store = MemoryStore()

    def params() -> RendezvousParameters:
        return RendezvousParameters(
            "memory", "scale-up", "job", 1, 2, store=store, last_call_timeout="0.05"
        )

    first_started = anyio.Event()
    events: list[AgentEvent] = []

    def on_first(event: AgentEvent) -> None:
        events.append(event)
        if isinstance(event, WorkersStarted):
            first_started.set()

    results: dict[str, RunResult] = {}
    with anyio.fail_after(BOUND):
        async with (
            get_rendezvous_handler(params()) as one,
            get_rendezvous_handler(params()) as two,
            anyio.create_task_group() as tg,
        ):
            worker = ("--out", str(tmp_path), "--block-unless-nodes", "2")
            tg.start_soon(
                run_into, results, "one", spec_for(one, *worker, local_world_size=1), on_first
            )
            await first_started.wait()
            tg.start_soon(run_into, results, "two", spec_for(two, *worker, local_world_size=1))
    changes = [e for e in events if isinstance(e, MembershipChanged)]
    assert [r.state for r in results.values()] == [RunState.SUCCEEDED] * 2
    assert [r.restart_count for r in results.values()] == [0, 0]
    assert [c.reason for c in changes] == ["NODES_WAITING"]
    finished = [e for e in records(tmp_path) if e["GROUP_WORLD_SIZE"] == "2"]
    assert sorted(e["RANK"] for e in finished) == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in finished} == {"2"}


async def test_a_member_that_never_takes_its_slot_does_not_hold_the_others(
    tmp_path: Path,
) -> None:
    """A node that completes a round but never starts workers (a bare handler here; in the
    field, a node that missed the result) must not keep the agents waiting for its slot once
    the round is invalidated: they re-rendezvous without it."""
    store = MemoryStore()

    def params() -> RendezvousParameters:
        return RendezvousParameters(
            "memory", "ghost", "job", 2, 3, store=store, last_call_timeout="0.05"
        )

    events: list[AgentEvent] = []
    results: dict[str, RunResult] = {}
    with anyio.fail_after(BOUND):
        async with (
            get_rendezvous_handler(params()) as one,
            get_rendezvous_handler(params()) as ghost,
            get_rendezvous_handler(params()) as two,
            anyio.create_task_group() as tg,
        ):
            worker = ("--out", str(tmp_path), "--block-unless-nodes", "2")
            tg.start_soon(
                run_into, results, "one", spec_for(one, *worker, local_world_size=1), events.append
            )
            first = await ghost.next_rendezvous()  # completes round 1 with node one
            assert first.world_size == 2
            tg.start_soon(run_into, results, "two", spec_for(two, *worker, local_world_size=1))
    changes = [e for e in events if isinstance(e, MembershipChanged)]
    assert [r.state for r in results.values()] == [RunState.SUCCEEDED] * 2
    assert [r.restart_count for r in results.values()] == [0, 0]
    assert [c.reason for c in changes] == ["NODES_WAITING"]
    started = [e for e in events if isinstance(e, WorkersStarted)]
    assert len(started) == 1, "node one started workers only in the round without the ghost"
    assert sorted(e["RANK"] for e in records(tmp_path)) == ["0", "1"]


async def test_restarts_exhausted_on_one_node_stops_the_others() -> None:
    """A node out of restarts closes the rendezvous; the other node stops its workers and fails."""
    store = MemoryStore()

    def params() -> RendezvousParameters:
        return RendezvousParameters("memory", "closing", "job", 2, 2, store=store)

    results: dict[str, RunResult] = {}
    with anyio.fail_after(BOUND):
        async with (
            get_rendezvous_handler(params()) as one,
            get_rendezvous_handler(params()) as two,
            anyio.create_task_group() as tg,
        ):
            worker = ("--fail-rank", "0", "--fail-attempts", "9", "--block-unless-nodes", "3")
            for name, handler in (("one", one), ("two", two)):
                spec = spec_for(handler, *worker, local_world_size=1, max_restarts=0)
                tg.start_soon(run_into, results, name, spec)
    failing = next(r for r in results.values() if r.failures)
    other = next(r for r in results.values() if not r.failures)
    assert (failing.state, failing.reason) == (RunState.FAILED, "restarts exhausted (0 allowed)")
    assert other.state is RunState.FAILED
    assert other.reason.startswith("the rendezvous was closed")
    assert other.returncodes == {0: -signal.SIGTERM}


async def test_statistics_count_rounds_restarts_and_failures(handler: Any) -> None:
    """statistics() is a snapshot of what the run did."""
    spec = spec_for(handler, "--fail-rank", "1", max_restarts=2)
    agent = ElasticAgent(spec, stdout=Console(), stderr=Console())
    with anyio.fail_after(BOUND):
        await agent.run()
    assert agent.statistics() == AgentStatistics(
        state="succeeded",
        rendezvous_rounds=2,
        restart_count=1,
        membership_changes=0,
        workers_started=4,
        worker_failures=1,
        reaps=0,
    )


async def test_tee_writes_the_console_and_the_file(handler: Any, tmp_path: Path) -> None:
    """With tee, a stream reaches the console prefixed and the log file as written."""
    out = Console()
    logs = LogSpec(log_dir=str(tmp_path), tee=Std.OUT, local_ranks_filter=frozenset({1}))
    _, events = await run_agent(spec_for(handler, logs=logs, max_restarts=0), stdout=out)
    run_dir = run_log_dir(events, tmp_path, handler.get_run_id()) / "attempt_0"
    assert "done rank=0 attempt=0" in (run_dir / "0" / "stdout.log").read_text()
    assert "[1]: done rank=1 attempt=0 nodes=1\n" in out.text
    assert "rank=0" not in out.text


async def test_a_failing_subscriber_does_not_stop_the_run(
    handler: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An event subscriber that raises is logged; the run goes on and succeeds."""

    def broken(event: AgentEvent) -> None:
        raise RuntimeError("subscriber bug")

    agent = ElasticAgent(spec_for(handler, max_restarts=0), stdout=Console(), on_event=broken)
    with anyio.fail_after(BOUND):
        result = await agent.run()
    assert result.state is RunState.SUCCEEDED
    assert "agent event subscriber" in caplog.text


async def test_nodes_with_different_worker_counts_get_contiguous_ranks(tmp_path: Path) -> None:
    """Nodes with one and two workers: global ranks run on in node order, world size 3."""
    store = MemoryStore()
    results: list[RunResult] = []
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:

            async def run(local_world_size: int) -> None:
                params = RendezvousParameters("memory", "mixed", "job", 2, 2, store=store)
                async with get_rendezvous_handler(params) as handler:
                    spec = spec_for(
                        handler, "--out", str(tmp_path), local_world_size=local_world_size
                    )
                    agent = ElasticAgent(spec, stdout=Console(), stderr=Console())
                    results.append(await agent.run())

            tg.start_soon(run, 1)
            tg.start_soon(run, 2)
    envs = records(tmp_path)
    by_node: dict[int, list[int]] = {}
    for env in envs:
        by_node.setdefault(int(env["GROUP_RANK"]), []).append(int(env["RANK"]))
    in_node_order = [rank for node in sorted(by_node) for rank in sorted(by_node[node])]
    assert [r.state for r in results] == [RunState.SUCCEEDED] * 2
    assert {env["WORLD_SIZE"] for env in envs} == {"3"}
    assert in_node_order == [0, 1, 2]
    assert sorted(len(ranks) for ranks in by_node.values()) == [1, 2]


async def test_many_restarts_leak_no_file_descriptors(handler: Any) -> None:
    """Ten failed attempts later, the agent holds no pipe, pidfd or file it did not hold before."""
    before = set(os.listdir("/proc/self/fd"))
    spec = spec_for(handler, "--fail-rank", "0", "--fail-attempts", "10", max_restarts=10)
    result, _ = await run_agent(spec)
    after = set(os.listdir("/proc/self/fd"))
    assert (result.state, result.restart_count) == (RunState.SUCCEEDED, 10)
    assert after - before == set()


async def test_a_finished_run_has_reaped_its_guardian(handler: Any) -> None:
    """The agent's guardian lives while it runs: exited and reaped once run() returns."""
    guardians: list[int] = []

    def find_guardian(event: AgentEvent) -> None:
        if isinstance(event, WorkersStarted):
            guardians.append(guardian_of(os.getpid()))

    agent = ElasticAgent(
        spec_for(handler, max_restarts=0),
        on_event=find_guardian,
        stdout=Console(),
        stderr=Console(),
    )
    with anyio.fail_after(BOUND):
        result = await agent.run()
    assert result.state is RunState.SUCCEEDED
    assert len(guardians) == 1
    assert reaped(guardians[0])
