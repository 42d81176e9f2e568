"""The local worker group of one attempt: started together, watched together, stopped together.

:meth:`WorkerGroup.run` starts a process per local rank (output pumps included), then waits
for the first of: every worker exiting 0, one failing (non-zero exit, a signal, or a reap the
agent routes in with :meth:`WorkerGroup.reaped`), or the caller's own waiter (the agent's
rendezvous watch). Whatever ended the wait, the workers still running get the polite signal
and, after the shutdown timeout (or at once when ``kill_now`` is set), SIGKILL. Failures are
the workers that ended on their own before the stop, or that the watchdog reaped.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from aioelastic._concurrency import first_of
from aioelastic.agent._devices import numa_bound_argv, virtual_local_rank_env
from aioelastic.agent._env import RoundInfo, WorkerRanks, worker_env
from aioelastic.agent._events import (
    AgentEvent,
    StepsMarked,
    WorkerFailed,
    WorkerReaped,
    WorkersStarted,
    WorkersStopped,
    WorkerSucceeded,
)
from aioelastic.agent._guardian import Guardian
from aioelastic.agent._logs import (
    FilteredCopy,
    SharedConsole,
    StreamPump,
    line_prefix,
    open_stream,
    plan_streams,
)
from aioelastic.agent._process import WorkerProcess
from aioelastic.agent._report import HangReport, WorkerFailure, read_error_file, signal_name
from aioelastic.agent._spec import WorkerSpec
from aioelastic.worker._steps import MAX_BATCH, STEPS_FD_ENV, StepMarksError, decode_batch

if TYPE_CHECKING:
    from aioelastic.agent._template import Template

T = TypeVar("T")

logger = logging.getLogger(__name__)

PUMP_DRAIN_TIMEOUT = 5.0
"""How long output pumps may keep reading after their workers were reaped (an escaped
grandchild can hold a pipe open forever)."""


class Outcome(enum.Enum):
    """What ended an attempt."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MEMBERSHIP = "membership changed"
    FENCED = "fenced"
    """This node's liveness lapsed: its workers are killed at once, not asked to stop."""
    CLOSED = "rendezvous closed"


@dataclass(slots=True)
class _Worker:
    ranks: WorkerRanks
    process: WorkerProcess
    error_file: str
    pumps: tuple[StreamPump, ...] = ()
    """What copies its stdout and stderr to the console (empty where nothing does)."""
    ended_at: float | None = None
    """When the agent saw it end, on the monotonic clock (``time.monotonic()``)."""


@dataclass(frozen=True, slots=True)
class _Exited:
    local_rank: int


@dataclass(frozen=True, slots=True)
class Consoles:
    """Where workers' console output goes: sinks for their stdout and stderr lines."""

    stdout: SharedConsole
    stderr: SharedConsole


class WorkerGroup:
    """The workers of one attempt on this node (see the module docstring)."""

    def __init__(
        self,
        spec: WorkerSpec,
        info: RoundInfo,
        ranks: list[WorkerRanks],
        *,
        attempt_dir: Path | None,
        private_dir: str,
        timer_file: str | None,
        consoles: Consoles,
        emit: Callable[[AgentEvent], None],
        guardian: Guardian | None = None,
        template: Template | None = None,
    ) -> None:
        self.spec = spec
        self.info = info
        self.ranks = ranks
        self._attempt_dir = attempt_dir
        self._private_dir = private_dir
        self._timer_file = timer_file
        self._consoles = consoles
        self._emit = emit
        self._guardian = guardian
        self._template = template
        """The fork template (``--preload``) workers are forked from while it is ready."""
        self.workers: list[_Worker] = []
        self.reaps: dict[int, WorkerReaped] = {}
        self.hang: HangReport | None = None
        """The stacks the agent captured before a reap (``_forensics.py``), if it did."""
        self.stop_started = math.inf
        """When :meth:`_stop` began, on the monotonic clock."""
        self._wall_offset = time.time() - time.monotonic()
        """Unix time minus monotonic time, read once: failures are ordered by the monotonic
        clock, and their Unix timestamps keep that order even if the wall clock steps."""
        self._failures: tuple[WorkerFailure, ...] = ()
        self._pump_scopes: list[anyio.CancelScope] = []
        self._copies: tuple[FilteredCopy | None, FilteredCopy | None] | None = None
        self._layout: Mapping[int, Any] | None = None
        self.reported: set[int] = set()
        """Pids whose failure was already reported while the group ran (in-place recovery)."""
        self.draining = False
        """The job is preempted: a worker's failure no longer stops the others; the group
        waits for every worker to exit (``_preemption.py``)."""
        self._notices, self._receive = anyio.create_memory_object_stream[_Exited | WorkerReaped](
            math.inf
        )

    @property
    def returncodes(self) -> dict[int, int]:
        """Exit status by local rank, for the workers that have been reaped."""
        return {
            w.ranks.local_rank: w.process.returncode
            for w in self.workers
            if w.process.returncode is not None
        }

    def bystanders(self) -> set[int]:
        """Pids a preemption neither tells nor signals (in-place recovery's waiting spares)."""
        return set()

    def worker_by_pid(self, pid: int) -> _Worker | None:
        """The worker whose process is ``pid``, if it is one of this group's."""
        return next((w for w in self.workers if w.process.pid == pid), None)

    def reaped(self, pid: int, scope_id: str, signum: int) -> WorkerReaped | None:
        """Note that the watchdog signalled ``pid``; return the event if it is one of ours."""
        for worker in self.workers:
            if worker.process.pid == pid:
                event = WorkerReaped(
                    worker.ranks.local_rank, worker.ranks.rank, pid, scope_id, signum
                )
                self.reaps[pid] = event
                self._notices.send_nowait(event)
                return event
        return None

    async def run(
        self,
        other: Callable[[], Awaitable[tuple[Outcome, str]]],
        *,
        shutdown: Callable[[], int | None],
        kill_now: anyio.Event,
    ) -> tuple[Outcome, str]:
        """Start the workers, wait for the first outcome, stop the rest; return the outcome.

        ``shutdown()`` returns the shutdown signal the agent received, if any: it is forwarded
        to the workers instead of SIGTERM.
        """
        outcome, detail = Outcome.FAILED, "cancelled"
        with self._notices, self._receive:
            async with (
                anyio.create_task_group() as pumps,
                anyio.create_task_group() as watchers,
            ):
                try:
                    self._start_workers(pumps, watchers)
                    outcome, detail = await first_of(self._wait_workers, other)
                finally:
                    with anyio.CancelScope(shield=True):
                        signum = shutdown()
                        reason = detail if signum is None else f"shutdown ({signal_name(signum)})"
                        polite = signal.SIGKILL if outcome is Outcome.FENCED else signal.SIGTERM
                        await self._stop(reason, signum or polite, kill_now)
                        drained_by = anyio.current_time() + PUMP_DRAIN_TIMEOUT
                        for scope in self._pump_scopes:
                            scope.deadline = min(scope.deadline, drained_by)
        for copy in self._copies or ():
            if copy is not None:
                copy.close()
        return outcome, detail

    def failures(self) -> tuple[WorkerFailure, ...]:
        """The workers that failed on their own (not those stopped), first failure first.

        Known once the group has stopped (empty before); error files are read once.
        """
        return self._failures

    def _collect_failures(self) -> tuple[WorkerFailure, ...]:
        failed = []
        for worker in self.workers:
            code, ended = worker.process.returncode, worker.ended_at
            reaped = self.reaps.get(worker.process.pid)
            if code is None or ended is None or code == 0:
                continue
            if ended > self.stop_started and reaped is None:
                continue
            failed.append(self._failure_of(worker))
        return tuple(sorted(failed, key=lambda f: f.timestamp))

    def _failure_of(self, worker: _Worker) -> WorkerFailure:
        """What a worker that ended on its own left behind (its error file read once)."""
        code, ended = worker.process.returncode, worker.ended_at
        assert code is not None
        assert ended is not None
        reaped = self.reaps.get(worker.process.pid)
        message, callstack = read_error_file(worker.error_file)
        return WorkerFailure(
            local_rank=worker.ranks.local_rank,
            rank=worker.ranks.rank,
            pid=worker.process.pid,
            returncode=code,
            timestamp=self._wall_offset + ended,
            error_file=worker.error_file,
            message=message,
            traceback=callstack,
            reaped_scope=reaped.scope_id if reaped else None,
            stack=self.hang.for_pid(worker.process.pid) if reaped and self.hang else None,
            hang=self.hang if reaped else None,
        )

    # -- inside run() -----------------------------------------------------------------------

    def _start_workers(self, pumps: TaskGroup, watchers: TaskGroup) -> None:
        """Start one worker per local rank (a subclass may start others)."""
        for ranks in self.ranks:
            worker = self._spawn(ranks, pumps)
            self.workers.append(worker)
            watchers.start_soon(self._watch, worker)
        self._emit(
            WorkersStarted(
                self.info.restart_count,
                tuple(w.ranks.rank for w in self.workers),
                tuple(w.process.pid for w in self.workers),
            )
        )

    def _spawn(
        self,
        ranks: WorkerRanks,
        pumps: TaskGroup,
        *,
        tag: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        pass_fds: Sequence[int] = (),
        shown_as: str | None = None,
    ) -> _Worker:
        """Start one worker; ``tag`` (default: its local rank) names its error file;
        ``shown_as`` replaces its ranks in its console prefix, and its files go under ``tag``
        (a spare holds no rank: not slot 0's prefix, not slot 0's log files)."""
        spec, info = self.spec, self.info
        tag = str(ranks.local_rank) if tag is None else tag
        if self._attempt_dir is not None:
            error_file = self._attempt_dir / tag / "error.json"
            error_file.parent.mkdir(parents=True, exist_ok=True)
        else:
            error_file = Path(self._private_dir, f"error-{info.restart_count}-{tag}.json")
        out_plan, err_plan = plan_streams(  # one shown as another keeps its files apart too
            spec.logs, ranks.local_rank, self._attempt_dir, directory=shown_as and tag
        )
        # A torch LogsSpecs (--logs-specs) lays out files by local rank; a spare holds none,
        # so its output goes where --redirects/--tee say, never into a rank's files.
        laid_out = None
        if spec.logs.layout is not None and shown_as is None:
            laid_out = self._laid_out().get(ranks.local_rank)
        if laid_out is not None:
            out_plan, err_plan = laid_out.stdout, laid_out.stderr
            if laid_out.error_file is not None:
                error_file = Path(laid_out.error_file)
                error_file.parent.mkdir(parents=True, exist_ok=True)
        error_file.unlink(missing_ok=True)
        env = worker_env(
            os.environ, spec, info, ranks, error_file=str(error_file), timer_file=self._timer_file
        )
        if laid_out is not None:
            env.update(laid_out.env)  # what the LogsSpecs's reify set, as under torchrun
        env.update(extra_env or {})
        if self._template is not None:  # what it imports, if started plainly (learning)
            env.update(self._template.recording_env(ranks.local_rank, env))
        steps, their_steps = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env[STEPS_FD_ENV] = str(their_steps.fileno())
        pass_fds = (*pass_fds, their_steps.fileno())
        argv = spec.argv
        if spec.virtual_local_rank:
            cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            env.update(virtual_local_rank_env(ranks.local_rank, cuda_visible))
        if spec.numa_binding is not None:
            argv = numa_bound_argv(argv, ranks.local_rank, spec.numa_binding)
        prefix = line_prefix(
            spec.logs.line_prefix,
            rank=ranks.rank if shown_as is None else shown_as,
            local_rank=ranks.local_rank if shown_as is None else shown_as,
            role_name=spec.role,
        )
        out_copy, err_copy = self._filtered_copies()
        out = open_stream(
            out_plan, prefix=prefix, console=self._consoles.stdout, duplicate=out_copy
        )
        err = open_stream(
            err_plan, prefix=prefix, console=self._consoles.stderr, duplicate=err_copy
        )
        try:
            process = WorkerProcess.spawn(
                argv,
                env,
                stdin=None if spec.logs.inherit_console else subprocess.DEVNULL,
                stdout=out.child_end,
                stderr=err.child_end,
                guardian=self._guardian,
                pass_fds=pass_fds,
                template=self._template,
            )
        except BaseException:
            steps.close()
            raise
        finally:
            out.after_spawn()
            err.after_spawn()
            their_steps.close()
        steps_scope = anyio.CancelScope(shield=True)  # bounded like the pumps
        self._pump_scopes.append(steps_scope)
        pumps.start_soon(self._read_steps, process.pid, steps, steps_scope)
        for stream in (out, err):
            if stream.pump is not None:
                # Shielded: a stopping run keeps relaying (not breaking) its workers' output
                # until they exited; the drain deadline set once they are reaped bounds it.
                scope = anyio.CancelScope(shield=True)
                self._pump_scopes.append(scope)
                pumps.start_soon(self._relay, stream.pump, scope)
        copies = tuple(stream.pump for stream in (out, err) if stream.pump is not None)
        return _Worker(ranks, process, str(error_file), copies)

    def _laid_out(self) -> Mapping[int, Any]:
        """This attempt's streams per local rank from the spec's layout, asked once."""
        if self._layout is None:
            assert self.spec.logs.layout is not None
            envs = {
                r.local_rank: {
                    "LOCAL_RANK": str(r.local_rank),
                    "RANK": str(r.rank),
                    "TORCHELASTIC_RUN_ID": self.info.run_id,
                    "TORCHELASTIC_RESTART_COUNT": str(self.info.restart_count),
                }
                for r in self.ranks
            }
            self._layout = self.spec.logs.layout(envs)
        return self._layout

    def _filtered_copies(self) -> tuple[FilteredCopy | None, FilteredCopy | None]:
        """This attempt's ``filtered_stdout.log``/``filtered_stderr.log``, opened once."""
        if self._copies is None:
            logs, where = self.spec.logs, self._attempt_dir

            def copy(name: str, needles: tuple[str, ...]) -> FilteredCopy | None:
                path = where / name if where else None
                if logs.layout is not None:  # --logs-specs: where its LogsSpecs said
                    laid_out = next(iter(self._laid_out().values()), None)
                    path = getattr(laid_out, name.removesuffix(".log"), None)
                return FilteredCopy(path, needles) if needles and path else None

            self._copies = (
                copy("filtered_stdout.log", logs.duplicate_stdout_filters),
                copy("filtered_stderr.log", logs.duplicate_stderr_filters),
            )
        assert self._copies is not None
        return self._copies

    async def _read_steps(self, pid: int, sock: socket.socket, scope: anyio.CancelScope) -> None:
        """Report each batch of step marks worker ``pid`` sends (``aioelastic/worker/_steps.py``)
        until its end closes; a datagram of another protocol ends the reading."""
        sock.setblocking(False)
        with scope, sock:
            while True:
                await anyio.wait_readable(sock)
                try:
                    data = sock.recv(MAX_BATCH + 1)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    return  # the worker (and whatever inherited its end) exited
                try:
                    batch = decode_batch(data)
                except StepMarksError as exc:
                    logger.warning("worker %d: %s; ignoring its step marks from now on", pid, exc)
                    return
                self._emit(
                    StepsMarked(
                        batch.rank,
                        pid,
                        batch.restart_count,
                        batch.generation,
                        batch.steps,
                        batch.times,
                        batch.done,
                        batch.saves,
                    )
                )

    @staticmethod
    async def _relay(pump: StreamPump, scope: anyio.CancelScope) -> None:
        with scope:
            await pump.run()

    async def _watch(self, worker: _Worker) -> None:
        # Shielded: cancelling the attempt must not SIGKILL the worker before _stop() has
        # given it the polite signal and the shutdown timeout; _stop() always ends it.
        with anyio.CancelScope(shield=True):
            await worker.process.watch()
        worker.ended_at = time.monotonic()
        self._notices.send_nowait(_Exited(worker.ranks.local_rank))

    async def _wait_workers(self) -> tuple[Outcome, str]:
        receive: MemoryObjectReceiveStream[_Exited | WorkerReaped] = self._receive
        remaining = {w.ranks.local_rank: w for w in self.workers}
        failed: str | None = None
        async for notice in receive:
            if isinstance(notice, WorkerReaped):
                failed = failed or f"rank {notice.rank} reaped by the watchdog"
                if not self.draining:
                    return Outcome.FAILED, failed
                continue
            worker = remaining.pop(notice.local_rank)
            if worker.process.returncode != 0:
                failed = failed or f"rank {worker.ranks.rank} failed"
                if not self.draining:
                    return Outcome.FAILED, failed
            else:
                self._emit(
                    WorkerSucceeded(worker.ranks.local_rank, worker.ranks.rank, worker.process.pid)
                )
            if not remaining:
                if failed is not None:
                    return Outcome.FAILED, failed
                return Outcome.SUCCEEDED, "all workers succeeded"
        raise AssertionError("the notice stream closed while workers were running")

    async def _stop(self, reason: str, signum: int, kill_now: anyio.Event) -> None:
        """Stop what still runs: ``signum``, then SIGKILL after the shutdown timeout."""
        self.stop_started = time.monotonic()
        alive = [w for w in self.workers if w.process.returncode is None]
        if alive:
            for worker in alive:
                worker.process.signal_group(signum)

            async def all_exited() -> bool:
                for worker in alive:
                    await worker.process.wait()
                return True

            async def killing_now() -> bool:
                await kill_now.wait()
                return False

            try:
                with anyio.move_on_after(self.spec.shutdown_timeout):
                    await first_of(all_exited, killing_now)
            finally:
                stubborn = [w for w in alive if w.process.returncode is None]
                for worker in stubborn:
                    worker.process.signal_group(signal.SIGKILL)
            await all_exited()
            self._emit(WorkersStopped(reason, signum, len(stubborn)))
        self._failures = self._collect_failures()
        for failure in self._failures:
            if failure.pid not in self.reported:
                self._emit(WorkerFailed(failure))
