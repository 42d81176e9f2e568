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
* a shutdown signal (or ``preemption_file`` appearing) while workers run: the whole job is
  preempted (``_preemption.py``): every node's workers stop at one agreed step (or get the
  signal, where they are not on the worker API) within the shutdown timeout, and the run ends
  as preempted. Under in-place recovery across nodes, and at any other time, or on a second
  signal, the signal stops this node: it is forwarded to the workers, SIGKILL follows after the
  shutdown timeout (or at once on a second signal), and the run ends as stopped.

Under ``--recovery in-place`` across nodes an attempt outlives rounds: a membership change
joins the next round while the workers run (:meth:`ElasticAgent._follow_rounds`), and the
group turns who is in it into generations (``_recovery.py``).

Waiting is never a poll: exits come from pidfds, reaps from the timer server's events, round
changes from the rendezvous handler. The local group of one attempt is a
:class:`~aioelastic.agent._group.WorkerGroup`; this module is the loop around it. Everything the
agent starts lives in task groups inside :meth:`ElasticAgent.run`, so cancelling it stops the
workers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus

from aioelastic._concurrency import first_of, unwrap_single_error
from aioelastic._service import Service
from aioelastic._subscribers import Subscribers
from aioelastic.agent._attempts import Attempts
from aioelastic.agent._env import RoundInfo, WorkerRanks
from aioelastic.agent._errors import AgentStateError
from aioelastic.agent._events import (
    AgentEvent,
    AgentStatistics,
    GroupRestarting,
    LogDirectoryCreated,
    RendezvousCompleted,
    RendezvousJoining,
    RunFinished,
    RunResult,
    RunState,
    ShutdownRequested,
    StacksCaptured,
    StepsMarked,
    StepTimes,
    TimeoutsLearnedIn,
)
from aioelastic.agent._group import Consoles, Outcome, WorkerGroup
from aioelastic.agent._guardian import Guardian, guardian_for
from aioelastic.agent._learned import watch as watch_loaded
from aioelastic.agent._logs import console_writer, make_run_log_dir
from aioelastic.agent._policy import Decision, Step, after_attempt
from aioelastic.agent._preemption import Preemption, watch_file
from aioelastic.agent._process import die_with_agent_prefix
from aioelastic.agent._recovery import InPlaceGroup
from aioelastic.agent._report import signal_name
from aioelastic.agent._round import (
    exit_barrier,
    joining,
    lapsed_while_joining,
    number_workers,
    round_ended,
)
from aioelastic.agent._spec import WorkerSpec
from aioelastic.agent._step_board import StepBoard
from aioelastic.agent._template import Template, node_template
from aioelastic.agent._timeouts import agent_timeouts, check_timeouts
from aioelastic.agent._worker_store import WorkerStore
from aioelastic.events._stragglers import StragglerSettings
from aioelastic.rendezvous import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousInfo,
)

if TYPE_CHECKING:
    from aioelastic.agent._forensics import Forensics, Peers
    from aioelastic.store import Store
    from aioelastic.timer import TimerEvent

logger = logging.getLogger(__name__)

EventCallback = Callable[[AgentEvent], None]


class ElasticAgent(Service):
    """Runs one node's workers of an elastic job (torch's ``LocalElasticAgent``, event-driven).

    ```python
    async with get_rendezvous_handler(params) as handler:
        spec = WorkerSpec(sys.executable, handler, args=("-u", "train.py"), local_world_size=4)
        result = await ElasticAgent(spec).run()
    ```
    ``shutdown_signals`` are handled while running (the launcher passes SIGTERM, SIGINT, SIGHUP
    and SIGQUIT; an embedding program usually cancels instead). Worker output goes to
    ``stdout``/``stderr`` (binary streams; default the process's own). ``on_watchdog_event``
    receives the watchdog's own timer events (acquired, released, expired, reaped, ...).
    The agent starts a guardian for its workers' processes (see ``_guardian.py``) unless given
    a running one (``aioelastic run`` starts it first, to overlap its start with imports).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        on_event: EventCallback | None = None,
        shutdown_signals: Sequence[signal.Signals] = (),
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        on_watchdog_event: Callable[[TimerEvent], None] | None = None,
        guardian: Guardian | None = None,
        stragglers: StragglerSettings | None = None,
    ) -> None:
        self.spec = spec
        self._steps = StepBoard(stragglers or StragglerSettings.from_env(), self._emit)
        self._on_watchdog_event = on_watchdog_event
        self._subscribers: Subscribers[AgentEvent] = Subscribers(logger, "agent event", on_event)
        self._shutdown_signals = tuple(shutdown_signals)
        self._consoles = Consoles(
            console_writer(stdout or sys.stdout.buffer),
            console_writer(stderr or sys.stderr.buffer),
        )
        self._state = "init"
        self._run_id = ""
        self._main_scope: anyio.CancelScope | None = None
        self._stop_signal: int | None = None
        self._kill_now: anyio.Event | None = None
        self._finished: anyio.Event | None = None
        self._final: RunResult | None = None
        self._group: WorkerGroup | None = None
        self._attempts = Attempts(spec)
        self._given_guardian = guardian
        self._guardian: Guardian | None = None
        self._template: Template | None = None
        self._timer_file: str | None = None
        self._stack_capture: Forensics | None = None
        self._temporary_stacks: Callable[[int], Path] | None = None
        self._round_store: Store | None = None
        self._info: RendezvousInfo | None = None
        """The round this node is in (in-place recovery across nodes follows later rounds)."""
        self._worker_store: WorkerStore | None = None
        self._preemption: Preemption | None = None
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
        return self._subscribers.add(callback)

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
    def warm_modules(self) -> list[str]:
        """The modules this node's workers had loaded by their first step, in import order
        (under ``--recovery in-place``, reported once by each worker; empty until then): what
        an idle spare imports, and what a process that will fork may import with
        ``aioelastic.worker._warm.import_modules(names, fork_safe=True)``. The list grows in
        place; copy it to keep a snapshot."""
        return self._attempts.warm_modules

    @property
    def step_times(self) -> StepTimes | None:
        """The last straggler window this node's workers' step marks closed."""
        return self._steps.latest

    @property
    def template(self) -> Template | None:
        """The node's fork template while running with ``spec.preload`` (None otherwise):
        ``await agent.template.import_modules([...])`` preloads more for the next forks."""
        return self._template

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

    def preempt(self, signum: int = signal.SIGTERM, *, source: str = "signal") -> None:
        """A preemption notice reached this node (``signum``, or a notice file): while workers
        run, the whole job stops at an agreed step (see ``_preemption.py``); otherwise, or when
        this node was already told once, it is :meth:`request_stop`."""
        preemption = self._preemption
        if (
            preemption is None
            or self._stop_signal is not None
            or not (preemption.watching or preemption.active is not None)
            or not preemption.request(signum, source)
        ):
            self.request_stop(signum)
            return
        self._emit(ShutdownRequested(signum))

    def _stop_serving(self, group: TaskGroup) -> None:
        """Leaving ``async with`` stops the run gracefully (SIGTERM to the workers first)."""
        if self._final is None:
            self.request_stop(signal.SIGTERM)

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
        check_timeouts(agent_timeouts(self.spec))  # before anything starts
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
            async with (
                guardian_for(
                    self._given_guardian, grace=self.spec.shutdown_timeout
                ) as self._guardian,
                node_template(
                    self.spec,
                    private,
                    emit=self._emit,
                    guardian=self._guardian,
                    prefix=die_with_agent_prefix(),
                ) as self._template,
                anyio.create_task_group() as tg,
            ):
                self._preemption = Preemption(
                    private,
                    timeout=self.spec.shutdown_timeout,
                    emit=self._emit,
                    stop_node=self.request_stop,
                )
                self._add_worker_env(self._preemption.env())
                await tg.start(self._preemption.serve)
                if self.spec.preemption_file is not None:
                    tg.start_soon(watch_file, self.spec.preemption_file, self._preempt_by_file)
                if self._shutdown_signals:
                    await tg.start(self._watch_signals)
                await self._start_watchdog(tg)
                self._worker_store = WorkerStore(
                    self.spec.rdzv_handler, expose=self.spec.torch_store == "expose"
                )
                await tg.start(self._worker_store.serve)
                tg.start_soon(self._steps.show, self._step_board_place)
                if self._template is not None and self._template.learning:
                    watching = partial(watch_loaded, self._worker_pids, self._reported_modules)
                    tg.start_soon(watching, self._template.learn, self._template.imports)
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
                self.preempt(signum)

    def _preempt_by_file(self) -> None:
        self.preempt(signal.SIGTERM, source="file")

    async def _start_watchdog(self, tg: TaskGroup) -> None:
        enabled = self.spec.watchdog
        if enabled is None:
            enabled = os.environ.get("TORCHELASTIC_ENABLE_FILE_TIMER", "1") != "0"
        if not enabled:
            return
        from aioelastic.timer import FileTimerServer, WatchPolicy

        self._learn_timeouts()
        forensics = self._stack_capture = self._forensics()
        server = FileTimerServer(
            os.environ.get("TORCHELASTIC_TIMER_FILE") or Path(self._private_dir, "watchdog"),
            self._run_id,
            on_event=self._on_timer_event,
            watch=WatchPolicy.descendants_of(os.getpid()),
            before_reap=None if forensics is None else forensics.before_reap,
            hook_timeout=self.spec.forensics.reap_bound,
        )
        if self._on_watchdog_event is not None:
            server.subscribe(self._on_watchdog_event)
        await tg.start(server.serve)
        self._timer_file = server.file_path

    def _forensics(self) -> Forensics | None:
        """The pre-reap stack capture (``_forensics.py``), when the spec asks for one."""
        if not (self.spec.forensics.stacks or self.spec.forensics.core_dump):
            return None
        from aioelastic.agent._forensics import Forensics, temporary_directory

        self._temporary_stacks = temporary_directory()

        signal_dir = Path(self._private_dir, "stacks")
        signal_dir.mkdir()
        forensics = Forensics(
            self.spec.forensics,
            group=lambda: self._group,
            directory=self._stacks_dir,
            signal_dir=str(signal_dir),
            on_report=lambda report: self._emit(StacksCaptured(report)),
            peers=self._peers,
        )
        self._add_worker_env(forensics.worker_env())
        return forensics

    def _add_worker_env(self, env: dict[str, str]) -> None:
        """Give every worker ``env`` (the spec's own env wins); only before the first attempt."""
        self.spec = replace(self.spec, env={**env, **self.spec.env})
        self._attempts = Attempts(self.spec)  # nothing to carry over yet

    def _learn_timeouts(self) -> None:
        """Tell workers where ``expires(after="auto")`` keeps what it learns: under
        ``--log-dir`` (it outlives the run), else in the agent's private directory."""
        from aioelastic.timer._learned import LEARNED_DIR_ENV

        log_dir = self.spec.logs.log_dir
        where = Path(log_dir, "learned-timeouts", self._run_id) if log_dir else None
        where = where or Path(self._private_dir, "learned-timeouts")
        where.mkdir(parents=True, exist_ok=True)
        self._add_worker_env({LEARNED_DIR_ENV: str(where)})
        self._emit(TimeoutsLearnedIn(str(where)))

    def _peers(self) -> Peers | None:
        from aioelastic.agent._forensics import Peers

        group, store = self._group, self._round_store
        if group is None or store is None:
            return None
        return Peers(store, group.info.group_rank, group.info.group_world_size)

    async def _wait_round_or_answer_stacks(self) -> tuple[Outcome, str]:
        """The attempt's outside waiter; meanwhile answer other nodes' stack requests."""
        forensics, store, group = self._stack_capture, self._round_store, self._group
        if forensics is None or store is None or group is None:
            return await self._wait_round_invalidated()
        from aioelastic.agent._stack_requests import serve_stack_requests

        node = group.info.group_rank

        async def answer() -> tuple[Outcome, str]:
            await serve_stack_requests(store, node, forensics.answer)

        return await first_of(self._wait_round_invalidated, answer)

    def _on_timer_event(self, event: TimerEvent) -> None:
        from aioelastic.timer import TimerReaped

        group = self._group
        if group is not None and isinstance(event, TimerReaped):
            reaped = group.reaped(event.pid, event.scope_id, event.signal)
            if reaped is not None:
                self._reaps += 1
                self._emit(reaped)

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
            self._attempts.store = info.store  # where in-place recovery shows its generation
            assigned = await self._assign_unless_invalidated(info)
            if isinstance(assigned[0], Outcome):  # a member never showed up; the round moved on
                early = self._decide(assigned[0], assigned[1])
                if early.step is Step.END:
                    return self._result(RunState.FAILED, reason=early.reason)
                self._membership_changes += 1
                continue
            round_info, ranks = assigned
            self._round_store = info.store
            self._info = info
            assert self._worker_store is not None
            async with self._worker_store.attempt(info, round_info) as round_info:
                group, outcome, detail = await self._run_attempt(round_info, ranks)
            if self._preemption is not None and self._preemption.active is not None:
                return await self._preempted(group, self._info or info)
            decision = self._decide(outcome, detail)
            match decision.step:
                case Step.SUCCEED:
                    await self._exit_barrier(self._info or info)
                    return self._result(RunState.SUCCEEDED, group, reason=decision.reason)
                case Step.REJOIN:
                    self._membership_changes += 1
                case Step.END:
                    return self._result(RunState.FAILED, group, reason=decision.reason)
                case Step.RESTART:
                    self._restart_count += 1
                    self._emit(GroupRestarting(self._restart_count, self.spec.max_restarts))
                case Step.GIVE_UP:
                    reason = decision.reason
                    try:
                        await handler.set_closed()
                    except RendezvousError as exc:
                        reason += f"; the other nodes were not told (closing failed: {exc})"
                    return self._result(RunState.FAILED, group, reason=reason)

    async def _preempted(self, group: WorkerGroup, info: RendezvousInfo) -> RunResult:
        """The run's end after a preemption: what each rank did, then the exit barrier."""
        preemption = self._preemption
        assert preemption is not None
        assert preemption.active is not None
        ended = await preemption.finish(group)
        await self._exit_barrier(info)
        return RunResult(
            RunState.PREEMPTED,
            returncodes=group.returncodes,
            restart_count=self._restart_count,
            signal=preemption.active.record.signal,
            reason=preemption.reason(ended),
        )

    def _decide(self, outcome: Outcome, detail: str) -> Decision:
        return after_attempt(
            outcome,
            detail,
            restart_count=self._restart_count,
            max_restarts=self.spec.max_restarts,
        )

    def _result(
        self, state: RunState, group: WorkerGroup | None = None, *, reason: str
    ) -> RunResult:
        if group is None:
            return RunResult(state, restart_count=self._restart_count, reason=reason)
        return RunResult(
            state,
            returncodes=group.returncodes,
            failures=group.failures() if state is RunState.FAILED else (),
            restart_count=self._restart_count,
            reason=reason,
        )

    async def _assign_unless_invalidated(
        self, info: RendezvousInfo
    ) -> tuple[RoundInfo, list[WorkerRanks]] | tuple[Outcome, str]:
        """:meth:`_assign`, or why the round ended first: a member that never writes its slot
        (it died, or never learned the result) must not hold the others until the store
        times out while the rendezvous has already moved on."""

        async def assign() -> tuple[RoundInfo, list[WorkerRanks]] | tuple[Outcome, str]:
            return await self._assign(info)

        return await first_of(assign, self._wait_round_invalidated)

    async def _assign(self, info: RendezvousInfo) -> tuple[RoundInfo, list[WorkerRanks]]:
        record = self._attempts.record()  # in-place recovery across nodes: the epoch it runs
        round_info, ranks, records = await number_workers(
            info, self.spec, record, run_id=self._run_id, restart_count=self._restart_count
        )
        if record is not None:
            self._attempts.heard(info, records)
        addr, port = round_info.master_addr, round_info.master_port
        self._emit(RendezvousCompleted(info.rank, info.world_size, ranks[0].world_size, addr, port))
        return round_info, ranks

    async def _exit_barrier(self, info: RendezvousInfo) -> None:
        spec = self.spec
        timeout = spec.exit_barrier_timeout
        await exit_barrier(spec.rdzv_handler, info, timeout=timeout, run_id=self._run_id)

    # -- one attempt ------------------------------------------------------------------------

    async def _run_attempt(
        self, info: RoundInfo, ranks: list[WorkerRanks]
    ) -> tuple[WorkerGroup, Outcome, str]:
        if self._template is not None:  # the launch fails here if the modules cannot preload
            await self._template.wait_ready()
        group = self._attempts.group(
            info,
            ranks,
            attempt_dir=self._attempt_dir(info.restart_count),
            private_dir=self._private_dir,
            timer_file=self._timer_file,
            consoles=self._consoles,
            emit=self._emit,
            guardian=self._guardian,
            template=self._template,
        )
        assert self._kill_now is not None
        self._group = group
        waiter = self._wait_round_or_answer_stacks
        shared = isinstance(group, InPlaceGroup) and group.shared
        if shared:
            waiter = self._follow_rounds
        preemption, store = self._preemption, self._round_store
        # In-place recovery across nodes answers a node's signal its own way: the node
        # leaves, and the others go on in a smaller world.
        if preemption is not None and store is not None and not shared:
            follow = waiter

            async def waiter() -> tuple[Outcome, str]:
                assert preemption is not None
                assert store is not None
                return await preemption.watch(
                    follow,
                    store=store,
                    node=info.group_rank,
                    nodes=info.group_world_size,
                    group=group,
                )

        try:
            outcome, detail = await group.run(
                waiter,
                shutdown=self._shutdown_signal,
                kill_now=self._kill_now,
            )
        finally:
            self._group = None
            self._workers_started += len(group.workers)
            self._worker_failures += len(group.failures())
        return group, outcome, detail

    def _step_board_place(self) -> tuple[Store, int] | None:
        """Where this node's step times are shown: its round's store and its rank there."""
        store, info = self._round_store, self._info
        return None if store is None or info is None else (store, info.rank)

    def _worker_pids(self) -> list[int]:
        """The pids of the attempt's workers (none between attempts)."""
        group = self._group
        return [] if group is None else [worker.process.pid for worker in group.workers]

    def _reported_modules(self) -> list[str]:
        return self._attempts.warm_modules

    def _shutdown_signal(self) -> int | None:
        """What the group's workers still running get when it stops: the shutdown signal, or
        SIGKILL once a preemption's deadline passed (None: the usual polite SIGTERM)."""
        if self._stop_signal is not None:
            return self._stop_signal
        if self._preemption is not None and self._preemption.deadline_passed:
            return signal.SIGKILL
        return None

    def _attempt_dir(self, restart_count: int) -> Path | None:
        logs = self.spec.logs
        if not logs.wants_files(self.spec.local_world_size):
            return None
        return self._run_log_dir() / f"attempt_{restart_count}"

    def _run_log_dir(self) -> Path:
        if self._log_dir is None:
            logs = self.spec.logs
            self._log_dir = make_run_log_dir(logs.log_dir, self._run_id)
            self._emit(LogDirectoryCreated(str(self._log_dir), temporary=logs.log_dir is None))
        return self._log_dir

    def _stacks_dir(self, restart_count: int) -> Path:
        """Where an attempt's stack captures go: the run's log directory under ``--log-dir``,
        else a temporary one (named in the report)."""
        if self.spec.logs.log_dir is None:
            assert self._temporary_stacks is not None  # made with the Forensics that asks
            return self._temporary_stacks(restart_count)
        return self._run_log_dir() / f"attempt_{restart_count}" / "stacks"

    async def _follow_rounds(self) -> tuple[Outcome, str]:
        """The outside waiter of an attempt that recovers in place across nodes: a membership
        change joins the next round *while the workers run*, and the group learns who is in it
        (a node gone makes a smaller world; a node joining is admitted); only being fenced,
        the rendezvous closing, or this node leaving a stale epoch ends the attempt."""
        handler = self.spec.rdzv_handler
        while True:
            outcome, detail = await self._wait_round_or_answer_stacks()
            if outcome is not Outcome.MEMBERSHIP:
                return outcome, detail
            self._membership_changes += 1
            self._emit(RendezvousJoining(self._run_id, handler.get_backend(), self._restart_count))
            try:
                joined = await first_of(
                    joining(handler.next_rendezvous),
                    partial(lapsed_while_joining, handler, self._emit),
                )
            except (RendezvousGracefulExitError, RendezvousClosedError) as exc:
                return Outcome.CLOSED, f"the rendezvous ended while recovering in place: {exc}"
            if not isinstance(joined, RendezvousInfo):
                return joined
            info = joined
            self._rounds += 1
            assigned = await self._assign_unless_invalidated(info)
            if isinstance(assigned[0], Outcome):
                if assigned[0] is Outcome.CLOSED:
                    return Outcome.CLOSED, assigned[1]
                continue  # the round moved on already: the next wait returns at once
            self._info = info
            self._round_store = self._attempts.store = info.store
            ended = self._attempts.new_round()
            if ended is not None:
                return ended

    async def _wait_round_invalidated(self) -> tuple[Outcome, str]:
        return await round_ended(self.spec.rdzv_handler, self._emit)

    def _emit(self, event: AgentEvent) -> None:
        self._subscribers.emit(event)  # a broken subscriber must not take the workers down
        if isinstance(event, StepsMarked):
            self._steps.feed(event)
