"""The elastic agent: keep this node's workers in one elastic group until the job ends.

Theory of operation. The agent loops over *attempts*. Each attempt joins a rendezvous round,
numbers the workers across nodes, starts the local group and then waits, event-driven, for the
first of:

* every worker exiting 0: the job succeeded (after an exit barrier with the other nodes);
* a worker failing (non-zero exit, a signal, or a watchdog reap): the group is stopped and,
  while restarts remain, started again after re-rendezvous; otherwise the rendezvous is
  closed so the other nodes stop too;
* the round becoming invalid (a node waits to join, or a participant was lost): the group is
  stopped and re-rendezvouses without costing a restart; a round closed by another node ends
  the run as failed;
* a shutdown signal: it is forwarded to the workers, SIGKILL follows after the shutdown
  timeout (or at once on a second signal), and the run ends as stopped.

Waiting is never a poll: exits come from pidfds, reaps from the timer server's events, round
changes from the rendezvous handler. Everything the agent starts lives in task groups inside
:meth:`ElasticAgent.run`, so cancelling it stops the workers.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioelastic.agent._env import NodeSlot, RoundInfo, WorkerRanks, assign_ranks, worker_env
from aioelastic.agent._errors import AgentStateError
from aioelastic.agent._events import (
    AgentEvent,
    AgentStatistics,
    GroupRestarting,
    MembershipChanged,
    RendezvousCompleted,
    RendezvousJoining,
    RunFinished,
    RunResult,
    RunState,
    ShutdownRequested,
    WorkerFailed,
    WorkerReaped,
    WorkersStarted,
    WorkersStopped,
    WorkerSucceeded,
)
from aioelastic.agent._logs import console_writer, line_prefix, open_stream, plan_streams
from aioelastic.agent._process import WorkerProcess
from aioelastic.agent._report import WorkerFailure, read_error_file, signal_name
from aioelastic.agent._spec import WorkerSpec
from aioelastic.rendezvous import (
    InvalidationReason,
    RendezvousClosedError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousInfo,
)
from aioelastic.store import StoreError

if TYPE_CHECKING:
    from aioelastic.timer import TimerEvent

logger = logging.getLogger(__name__)

T = TypeVar("T")

EventCallback = Callable[[AgentEvent], None]

_PUMP_DRAIN_TIMEOUT = 5.0
"""How long output pumps may keep reading after their workers were reaped (an escaped
grandchild can hold a pipe open forever)."""

_STORE_PREFIX = "aioelastic/agent/"


@contextlib.contextmanager
def unwrap_single_error() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself, so callers catch what was raised."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def first_of(*waiters: Callable[[], Awaitable[T]]) -> T:
    """Run ``waiters`` concurrently; return the first result and cancel the others."""
    results: list[T] = []
    with unwrap_single_error():
        async with anyio.create_task_group() as tg:

            async def run(waiter: Callable[[], Awaitable[T]]) -> None:
                results.append(await waiter())
                tg.cancel_scope.cancel()

            for waiter in waiters:
                tg.start_soon(run, waiter)
    return results[0]


class _Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MEMBERSHIP = "membership changed"
    CLOSED = "rendezvous closed"


@dataclass(slots=True)
class _Worker:
    ranks: WorkerRanks
    process: WorkerProcess
    error_file: str
    ended_at: float | None = None


@dataclass(frozen=True, slots=True)
class _Exited:
    local_rank: int


@dataclass(slots=True)
class _Attempt:
    """One started group: its workers and what stopped it."""

    workers: list[_Worker]
    notices: MemoryObjectSendStream[_Exited | WorkerReaped]
    outcome: _Outcome = _Outcome.FAILED
    detail: str = ""
    stop_started: float = math.inf
    reaps: dict[int, WorkerReaped] = field(default_factory=dict)


class ElasticAgent:
    """Runs one node's workers of an elastic job (torch's ``LocalElasticAgent``, event-driven).

    ```python
    async with get_rendezvous_handler(params) as handler:
        spec = WorkerSpec(sys.executable, handler, args=("-u", "train.py"), local_world_size=4)
        result = await ElasticAgent(spec).run()
    ```
    ``shutdown_signals`` are handled while running (the launcher passes SIGTERM, SIGINT, SIGHUP
    and SIGQUIT; an embedding program usually cancels instead). Worker output goes to
    ``stdout``/``stderr`` (binary streams; default the process's own).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        on_event: EventCallback | None = None,
        shutdown_signals: Sequence[signal.Signals] = (),
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
    ) -> None:
        self.spec = spec
        self._subscribers: list[EventCallback] = [on_event] if on_event is not None else []
        self._shutdown_signals = tuple(shutdown_signals)
        self._stdout = stdout
        self._stderr = stderr
        self._state = "init"
        self._run_id = ""
        self._main_scope: anyio.CancelScope | None = None
        self._stop_signal: int | None = None
        self._kill_now: anyio.Event | None = None
        self._finished: anyio.Event | None = None
        self._final: RunResult | None = None
        self._owned_group: TaskGroup | None = None
        self._attempt: _Attempt | None = None
        self._timer_file: str | None = None
        self._private_dir = ""
        self._log_dir: Path | None = None
        self._rounds = 0
        self._restart_count = 0
        self._membership_changes = 0
        self._workers_started = 0
        self._worker_failures = 0
        self._reaps = 0

    # -- public surface -------------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Deliver every event to ``callback``; returns a function that unsubscribes it."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def statistics(self) -> AgentStatistics:
        """A snapshot of the counters."""
        return AgentStatistics(
            state=self._state,
            rendezvous_rounds=self._rounds,
            restart_count=self._restart_count,
            membership_changes=self._membership_changes,
            workers_started=self._workers_started,
            worker_failures=self._worker_failures,
            reaps=self._reaps,
        )

    @property
    def timer_file(self) -> str | None:
        """The watchdog FIFO workers are told about, while running with the watchdog on."""
        return self._timer_file

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the run as if ``signum`` arrived: forward it, then SIGKILL after the timeout."""
        self._emit(ShutdownRequested(signum))
        if self._stop_signal is not None:
            if self._kill_now is not None:
                self._kill_now.set()
            return
        self._stop_signal = signum
        if self._main_scope is not None:
            self._main_scope.cancel()

    async def __aenter__(self) -> Self:
        """Start :meth:`run` in the background; leaving the block stops it (SIGTERM first)."""
        group = anyio.create_task_group()
        await group.__aenter__()
        self._owned_group = group
        await group.start(self.serve)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._owned_group = self._owned_group, None
        assert group is not None, "the agent was exited without being entered"
        if self._final is None:
            self.request_stop(signal.SIGTERM)
        return await group.__aexit__(exc_type, exc, tb)

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run inside the caller's task group: ``await tg.start(agent.serve)``; see :meth:`wait`."""
        await self.run(task_status=task_status)

    async def wait(self) -> RunResult:
        """Return the result once the run (started by ``async with`` or :meth:`serve`) ended."""
        if self._finished is None:
            raise AgentStateError("wait() needs a started agent: use async with or serve()")
        await self._finished.wait()
        assert self._final is not None
        return self._final

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> RunResult:
        """Run the job on this node until it succeeds, fails for good or is stopped."""
        if self._state != "init":
            raise AgentStateError(f"an ElasticAgent runs once; this one is {self._state}")
        self._state = "running"
        self._kill_now = anyio.Event()
        self._finished = anyio.Event()
        self._run_id = self.spec.rdzv_handler.get_run_id()
        result: RunResult | None = None
        with (
            tempfile.TemporaryDirectory(prefix="aioelastic-agent-") as private,
            unwrap_single_error(),
        ):
            self._private_dir = private
            async with anyio.create_task_group() as tg:
                if self._shutdown_signals:
                    await tg.start(self._watch_signals)
                await self._start_watchdog(tg)
                task_status.started()
                with anyio.CancelScope() as self._main_scope:
                    if self._stop_signal is None:
                        result = await self._supervise()
                tg.cancel_scope.cancel()
        if result is None:  # only request_stop() cancels the main scope
            signum = self._stop_signal or signal.SIGTERM
            result = RunResult(
                RunState.STOPPED,
                restart_count=self._restart_count,
                signal=signum,
                reason=f"stopped by {signal_name(signum)}",
            )
        self._state = result.state.value
        self._final = result
        self._finished.set()
        self._emit(RunFinished(result))
        return result

    # -- set-up ---------------------------------------------------------------------------

    async def _watch_signals(self, *, task_status: TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(*self._shutdown_signals) as received:
            task_status.started()
            async for signum in received:
                self.request_stop(signum)

    async def _start_watchdog(self, tg: TaskGroup) -> None:
        enabled = self.spec.watchdog
        if enabled is None:
            enabled = os.environ.get("TORCHELASTIC_ENABLE_FILE_TIMER", "1") != "0"
        if not enabled:
            return
        from aioelastic.timer import FileTimerServer, WatchPolicy

        server = FileTimerServer(
            os.environ.get("TORCHELASTIC_TIMER_FILE") or Path(self._private_dir, "watchdog"),
            self._run_id,
            on_event=self._on_timer_event,
            watch=WatchPolicy.descendants_of(os.getpid()),
        )
        await tg.start(server.serve)
        self._timer_file = server.file_path

    def _on_timer_event(self, event: TimerEvent) -> None:
        from aioelastic.timer import TimerReaped

        attempt = self._attempt
        if attempt is None or not isinstance(event, TimerReaped):
            return
        for worker in attempt.workers:
            if worker.process.pid == event.pid:
                reaped = WorkerReaped(
                    worker.ranks.local_rank,
                    worker.ranks.rank,
                    event.pid,
                    event.scope_id,
                    event.signal,
                )
                attempt.reaps[event.pid] = reaped
                self._reaps += 1
                self._emit(reaped)
                attempt.notices.send_nowait(reaped)

    # -- the loop ---------------------------------------------------------------------------

    async def _supervise(self) -> RunResult:
        handler = self.spec.rdzv_handler
        while True:
            self._emit(RendezvousJoining(self._run_id, handler.get_backend(), self._restart_count))
            try:
                info = await handler.next_rendezvous()
            except RendezvousGracefulExitError as exc:
                return self._result(RunState.SUCCEEDED, reason=str(exc))
            except RendezvousClosedError:
                return self._result(
                    RunState.FAILED,
                    reason="the rendezvous was closed: another node ended the job",
                )
            self._rounds += 1
            round_info, ranks = await self._assign(info)
            attempt = await self._run_attempt(round_info, ranks)
            outcome = attempt.outcome
            if outcome is _Outcome.SUCCEEDED:
                await self._exit_barrier(info)
                return self._result(RunState.SUCCEEDED, attempt)
            if outcome is _Outcome.MEMBERSHIP:
                self._membership_changes += 1
                continue
            if outcome is _Outcome.CLOSED:
                return self._result(RunState.FAILED, attempt, reason=attempt.detail)
            if self._restart_count < self.spec.max_restarts:
                self._restart_count += 1
                self._emit(GroupRestarting(self._restart_count, self.spec.max_restarts))
                continue
            reason = f"restarts exhausted ({self.spec.max_restarts} allowed)"
            try:
                await handler.set_closed()
            except RendezvousError as exc:
                reason += f"; the other nodes were not told (closing failed: {exc})"
            return self._result(RunState.FAILED, attempt, reason=reason)

    def _result(
        self, state: RunState, attempt: _Attempt | None = None, *, reason: str = ""
    ) -> RunResult:
        if attempt is None:
            return RunResult(state, restart_count=self._restart_count, reason=reason)
        returncodes = {
            w.ranks.local_rank: w.process.returncode
            for w in attempt.workers
            if w.process.returncode is not None
        }
        return RunResult(
            state,
            returncodes=returncodes,
            failures=self._failures(attempt) if state is RunState.FAILED else (),
            restart_count=self._restart_count,
            reason=reason or attempt.detail,
        )

    async def _assign(self, info: RendezvousInfo) -> tuple[RoundInfo, list[WorkerRanks]]:
        """Number this node's workers across the job (one store round trip per node)."""
        slot = NodeSlot(self.spec.role, self.spec.local_world_size)
        if info.world_size == 1:
            nodes = [slot]
        else:
            keys = [f"{_STORE_PREFIX}slot/{rank}" for rank in range(info.world_size)]
            await info.store.set(keys[info.rank], slot.encode())
            nodes = [NodeSlot.decode(raw) for raw in await info.store.multi_get(keys)]
        ranks = assign_ranks(nodes, info.rank)
        bootstrap = info.bootstrap_store_info
        round_info = RoundInfo(
            run_id=self._run_id,
            group_rank=info.rank,
            group_world_size=info.world_size,
            master_addr=bootstrap.master_addr,
            master_port=bootstrap.master_port,
            restart_count=self._restart_count,
            use_agent_store=self.spec.rdzv_handler.use_agent_store,
        )
        self._emit(
            RendezvousCompleted(
                info.rank,
                info.world_size,
                ranks[0].world_size,
                bootstrap.master_addr,
                bootstrap.master_port,
            )
        )
        return round_info, ranks

    async def _exit_barrier(self, info: RendezvousInfo) -> None:
        """Wait (bounded) until every node's workers succeeded; the last to finish closes the job.

        The last node closes the rendezvous *before* announcing the end, and nobody touches
        the store after the announcement: the node hosting the store may leave at once.
        """
        handler = self.spec.rdzv_handler
        if info.world_size == 1:
            await handler.set_closed()
            return
        done = f"{_STORE_PREFIX}exit/done"

        async def everyone_done() -> None:
            if await info.store.add(f"{_STORE_PREFIX}exit/count", 1) >= info.world_size:
                await handler.set_closed()
                await info.store.set(done, b"1")
            else:
                await info.store.wait([done], timeout=math.inf)

        async def round_broken() -> None:
            await handler.wait_round_invalidated()  # a node left: stop waiting for it

        with anyio.move_on_after(self.spec.exit_barrier_timeout):
            try:
                await first_of(everyone_done, round_broken)
            except (StoreError, RendezvousError) as exc:  # our workers succeeded regardless
                logger.warning("exit barrier of run %r cut short: %s", self._run_id, exc)

    # -- one attempt ------------------------------------------------------------------------

    async def _run_attempt(self, info: RoundInfo, ranks: list[WorkerRanks]) -> _Attempt:
        send, receive = anyio.create_memory_object_stream[_Exited | WorkerReaped](math.inf)
        attempt = _Attempt([], send)
        with send, receive:
            async with anyio.create_task_group() as pumps:
                async with anyio.create_task_group() as watchers:
                    try:
                        self._attempt = attempt
                        for worker_ranks in ranks:
                            worker = self._spawn(info, worker_ranks, pumps)
                            attempt.workers.append(worker)
                            watchers.start_soon(self._watch, worker, send)
                        self._workers_started += len(ranks)
                        self._emit(
                            WorkersStarted(
                                info.restart_count,
                                tuple(w.ranks.rank for w in attempt.workers),
                                tuple(w.process.pid for w in attempt.workers),
                            )
                        )
                        attempt.outcome, attempt.detail = await first_of(
                            lambda: self._wait_workers(attempt, receive),
                            self._wait_round_invalidated,
                        )
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._stop(attempt)
                        self._attempt = None
                pumps.cancel_scope.deadline = anyio.current_time() + _PUMP_DRAIN_TIMEOUT
        return attempt

    def _spawn(self, info: RoundInfo, ranks: WorkerRanks, pumps: TaskGroup) -> _Worker:
        spec = self.spec
        attempt_dir = self._attempt_dir(info.restart_count)
        if attempt_dir is not None:
            error_file = attempt_dir / str(ranks.local_rank) / "error.json"
            error_file.parent.mkdir(parents=True, exist_ok=True)
        else:
            error_file = Path(
                self._private_dir, f"error-{info.restart_count}-{ranks.local_rank}.json"
            )
        error_file.unlink(missing_ok=True)
        env = worker_env(
            os.environ,
            spec,
            info,
            ranks,
            error_file=str(error_file),
            timer_file=self._timer_file,
        )
        prefix = line_prefix(
            spec.logs.line_prefix,
            rank=ranks.rank,
            local_rank=ranks.local_rank,
            role_name=spec.role,
        )
        out_plan, err_plan = plan_streams(spec.logs, ranks.local_rank, attempt_dir)
        out = open_stream(out_plan, prefix=prefix, console=self._console(self._stdout, 1))
        err = open_stream(err_plan, prefix=prefix, console=self._console(self._stderr, 2))
        try:
            process = WorkerProcess.spawn(
                spec.argv, env, stdout=out.child_end, stderr=err.child_end
            )
        finally:
            out.after_spawn()
            err.after_spawn()
        for stream in (out, err):
            if stream.pump is not None:
                pumps.start_soon(stream.pump.run)
        return _Worker(ranks, process, str(error_file))

    @staticmethod
    def _console(stream: IO[bytes] | None, fd: int) -> Callable[[bytes], None]:
        if stream is None:
            stream = sys.stdout.buffer if fd == 1 else sys.stderr.buffer
        return console_writer(stream)

    def _attempt_dir(self, restart_count: int) -> Path | None:
        logs = self.spec.logs
        if not logs.wants_files(self.spec.local_world_size):
            return None
        if self._log_dir is None:
            base = logs.log_dir or tempfile.mkdtemp(prefix="aioelastic-logs-")
            self._log_dir = Path(base, self._run_id)
        return self._log_dir / f"attempt_{restart_count}"

    async def _watch(self, worker: _Worker, notices: MemoryObjectSendStream[_Exited]) -> None:
        # Shielded: cancelling the attempt must not SIGKILL the worker before _stop() has
        # given it the polite signal and the shutdown timeout; _stop() always ends it.
        with anyio.CancelScope(shield=True):
            await worker.process.watch()
        worker.ended_at = time.time()
        notices.send_nowait(_Exited(worker.ranks.local_rank))

    async def _wait_workers(
        self, attempt: _Attempt, notices: MemoryObjectReceiveStream[_Exited | WorkerReaped]
    ) -> tuple[_Outcome, str]:
        remaining = {w.ranks.local_rank: w for w in attempt.workers}
        async for notice in notices:
            if isinstance(notice, WorkerReaped):
                return _Outcome.FAILED, f"rank {notice.rank} reaped by the watchdog"
            worker = remaining.pop(notice.local_rank)
            if worker.process.returncode != 0:
                return _Outcome.FAILED, f"rank {worker.ranks.rank} failed"
            self._emit(
                WorkerSucceeded(worker.ranks.local_rank, worker.ranks.rank, worker.process.pid)
            )
            if not remaining:
                return _Outcome.SUCCEEDED, "all workers succeeded"
        raise AssertionError("the notice stream closed while workers were running")

    async def _wait_round_invalidated(self) -> tuple[_Outcome, str]:
        event = await self.spec.rdzv_handler.wait_round_invalidated()
        if event.reason is InvalidationReason.CLOSED:
            return _Outcome.CLOSED, f"the rendezvous was closed: {event.detail}"
        self._emit(MembershipChanged(event.reason.name, event.detail))
        return _Outcome.MEMBERSHIP, event.detail

    async def _stop(self, attempt: _Attempt) -> None:
        """Stop what still runs: the polite signal, then SIGKILL after the shutdown timeout."""
        attempt.stop_started = time.time()
        alive = [w for w in attempt.workers if w.process.returncode is None]
        if alive:
            signum = self._stop_signal or signal.SIGTERM
            for worker in alive:
                worker.process.signal_group(signum)

            async def all_exited() -> bool:
                for worker in alive:
                    await worker.process.wait()
                return True

            async def kill_now() -> bool:
                assert self._kill_now is not None
                await self._kill_now.wait()
                return False

            try:
                with anyio.move_on_after(self.spec.shutdown_timeout):
                    await first_of(all_exited, kill_now)
            finally:
                stubborn = [w for w in alive if w.process.returncode is None]
                for worker in stubborn:
                    worker.process.signal_group(signal.SIGKILL)
            await all_exited()
            reason = attempt.detail or "cancelled"
            if self._stop_signal is not None:
                reason = f"shutdown ({signal_name(self._stop_signal)})"
            self._emit(WorkersStopped(reason, signum, len(stubborn)))
        for failure in self._failures(attempt):
            self._worker_failures += 1
            self._emit(WorkerFailed(failure))

    def _failures(self, attempt: _Attempt) -> tuple[WorkerFailure, ...]:
        """The workers that failed on their own (not those the agent stopped), first first."""
        failed = []
        for worker in attempt.workers:
            code = worker.process.returncode
            reaped = attempt.reaps.get(worker.process.pid)
            ended = worker.ended_at
            if code is None or ended is None or code == 0:
                continue
            if ended > attempt.stop_started and reaped is None:
                continue
            message, callstack = read_error_file(worker.error_file)
            failed.append(
                WorkerFailure(
                    local_rank=worker.ranks.local_rank,
                    rank=worker.ranks.rank,
                    pid=worker.process.pid,
                    returncode=code,
                    timestamp=ended,
                    error_file=worker.error_file,
                    message=message,
                    traceback=callstack,
                    reaped_scope=reaped.scope_id if reaped else None,
                )
            )
        return tuple(sorted(failed, key=lambda f: f.timestamp))

    def _emit(self, event: AgentEvent) -> None:
        for callback in tuple(self._subscribers):
            try:
                callback(event)
            except Exception:  # a broken subscriber must not take the workers down
                logger.exception("agent event subscriber %r failed on %r", callback, event)
