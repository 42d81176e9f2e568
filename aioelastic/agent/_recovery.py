"""The shell of in-place recovery: processes and links in, generations out.

:class:`InPlaceGroup` is the :class:`~aioelastic.agent._group.WorkerGroup` of an attempt under
``--recovery in-place``, on one node as across many. It runs this agent's
:class:`~aioelastic.agent._replica.Replica` of the job's world and only does I/O: it starts
workers and warm spares (each linked to the agent, ``_worker_links.py``), tells them their
places and the ends of their worlds, and reports. What it feeds the replica comes from pidfds (a
death is seen at once, no heartbeat), the links (hello, entered, trouble), the abort answers and
the replica's own deadlines; it goes through the world's log (``_generation_store.py``): this
agent's memory on one node, the job's store across nodes. The attempt ends when the machine
finishes (every member exited 0), falls back (then the agent restarts the group, costing a
restart, exactly as ``--recovery restart`` would) or takes this node out.
A worker that asks nothing of the API is an ordinary worker: see the machine's WAITING phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from aioelastic.agent import _generations as g
from aioelastic.agent._env import RoundInfo, WorkerRanks
from aioelastic.agent._events import (
    AgentEvent,
    CollectivesAborted,
    GenerationAssigned,
    GenerationFormed,
    RecoveryFellBack,
    ReplacedWorker,
    WorkerEvicted,
    WorkerFailed,
    WorkerRestartedToLeave,
    WorkersStarted,
    WorkerSucceeded,
)
from aioelastic.agent._generation_log import NodeRecord, plan_epoch
from aioelastic.agent._generation_store import JobLog, OwnLog
from aioelastic.agent._group import Outcome, _Worker
from aioelastic.agent._replica import CANNOT_ABORT_GRACE, VERDICT_GRACE, Replica
from aioelastic.agent._spec import WorkerSpec
from aioelastic.agent._worker_links import (
    SPARE_ENV,
    LinkedWorkers,
    Notice,
    _Answered,
    _Exit,
    _Linked,
    _Logged,
)
from aioelastic.rendezvous import NodeLost as RendezvousNodeLost
from aioelastic.rendezvous import RendezvousEvent
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.store import Store, StoreError
from aioelastic.worker._abort import AbortOutcome, AbortReply
from aioelastic.worker._protocol import (
    Enter,
    Hello,
    Loaded,
    NoMoreWorlds,
    StillValid,
    Trouble,
    Warm,
    WorldAssigned,
    WorldEnded,
    chunked,
)

__all__ = [
    "CANNOT_ABORT_GRACE",
    "LEAVE_NOTICE_TIMEOUT",
    "SPARE_ENV",
    "VERDICT_GRACE",
    "InPlaceGroup",
    "NodeRecord",
    "encode_generation",
    "plan_epoch",
]

logger = logging.getLogger(__name__)

LEAVE_NOTICE_TIMEOUT = 2.0
"""How long a node stopped by a signal may spend logging that it leaves (then it stops its
workers anyway: the others find it gone by its heartbeat)."""


def encode_generation(machine: g.GenerationMachine, pids: Mapping[g.WorkerKey, int]) -> bytes:
    """What ``aioelastic status`` reads: the generation, its pids by rank, the spares' pids."""
    generation = machine.generation
    spares = [pids[key] for key in machine.spares() if key in pids]
    return json.dumps(
        {
            "generation": 0 if generation is None else generation.number,
            "phase": machine.phase.name.lower(),
            "pids": [] if generation is None else [pids.get(k, 0) for k in generation.members],
            "spares": spares,
        }
    ).encode()


class InPlaceGroup(LinkedWorkers):
    """This node's workers under in-place recovery (see the module docstring).

    With ``job`` (the run's store), the group is this node's part of a world over many nodes:
    ``node`` is its rendezvous node id and ``records`` every node's :class:`NodeRecord` of
    round ``round_``, from which it begins or joins the job's epoch.
    """

    first_generation = 1
    """The number of this attempt's first generation (numbers go on across attempts)."""
    store: Store | None = None
    """Where the node's generation is shown (``aioelastic status``), if anywhere."""
    warm_modules: list[str] | None = None
    """The modules this node's workers had loaded by their first step, in import order (each
    reports them once, see ``aioelastic/worker/_warm.py``): what its idle spares import.
    :class:`Attempts` shares one list across attempts; a group without one keeps its own."""
    epochs_run: set[int] | None = None
    """Across nodes, the epochs this agent's groups began or joined (:class:`Attempts` shares
    one set across attempts; None: unknown, every epoch taken for one it ran)."""

    def __init__(
        self,
        spec: WorkerSpec,
        info: RoundInfo,
        ranks: list[WorkerRanks],
        *,
        job: Store | None = None,
        node: int | None = None,
        records: Sequence[NodeRecord] = (),
        round_: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(spec, info, ranks, **options)
        self.node = info.group_rank if node is None else node
        self.shared = job is not None
        """Whether the world spans many nodes (its log is in the job's store)."""
        self._job = job
        self._plan = None if job is None else plan_epoch(self.node, records, round_)
        self.epoch = 0 if self._plan is None else self._plan.epoch
        self.running = False
        token = f"{self.node}-{uuid.uuid4().hex[:12]}"
        self.replica = Replica(
            self.node,
            recovery_timeout=spec.recovery_timeout,
            replicated=self.shared,
            token=token,
        )

    @property
    def machine(self) -> g.GenerationMachine:
        """The replica's machine (once the attempt began or joined its epoch)."""
        machine = self.replica.machine
        assert machine is not None, "the attempt has not begun"
        return machine

    @property
    def live(self) -> bool:
        """Whether this group runs its epoch still (not finished, not fallen back)."""
        return self.running and (self.replica.machine is None or self.replica.live)

    def _setup(self) -> None:
        self.status_rank = self.info.group_rank
        self._linked: dict[g.WorkerKey, _Linked] = {}
        self._remote_pids: dict[g.WorkerKey, int] = {}
        self._tell, self._heard = anyio.create_memory_object_stream[Notice](math.inf)
        self._reports: list[Callable[[], AgentEvent]] = []
        """Reports made once the workers were told (reading an error file, writing events)."""
        self._shown = anyio.Event()
        if self.warm_modules is None:
            self.warm_modules = []
        self._known_modules = set(self.warm_modules)
        self._warmed: dict[g.WorkerKey, int] = {}
        spec = g.NodeSpec(self.spec.local_world_size, self.spec.spares)
        plan = self._plan
        if self._job is None or plan is None:
            begin = g.Begin({self.node: spec}, self.first_generation)
            self._log: OwnLog | JobLog = OwnLog(begin, self.info.restart_count)
        else:
            self._log = JobLog(
                self._job,
                self.epoch,
                self.replica.token,
                begin=plan.begin,
                read_timeout=self.spec.recovery_timeout,
            )

    async def run(
        self,
        other: Callable[[], Awaitable[tuple[Outcome, str]]],
        *,
        shutdown: Callable[[], int | None],
        kill_now: anyio.Event,
    ) -> tuple[Outcome, str]:
        if self._plan is not None and self._plan.action not in ("begin", "join"):
            raise AssertionError(f"a new group cannot {self._plan.action} an epoch")
        self._setup()
        self.running = True
        self._shutdown = shutdown
        handler = self.spec.rdzv_handler
        stop_hearing = None
        if self.shared and isinstance(handler, ElasticRendezvousHandler):
            stop_hearing = handler.subscribe(self._on_rendezvous_event)
        try:
            heard = self._tell.send_nowait
            async with self._log.serving(lambda entry: heard(_Logged(entry))) as self._begin:
                with self._tell, self._heard:
                    return await super().run(other, shutdown=shutdown, kill_now=kill_now)
        finally:
            self.running = False
            if stop_hearing is not None:
                stop_hearing()
            for linked in self._linked.values():
                linked.link.close()
                linked.abort.close()

    async def _stop(self, reason: str, signum: int, kill_now: anyio.Event) -> None:
        """A node stopped by a signal leaves the world cleanly: across nodes it logs its own
        loss before its workers stop, so the others make their smaller world at once instead
        of after a heartbeat timeout (and never take its workers' deaths for their own)."""
        leaving = self.replica.saw_leaving() if self._shutdown() is not None else None
        if leaving is not None and self.running:
            with anyio.move_on_after(LEAVE_NOTICE_TIMEOUT):
                await self._log.append_now(leaving)
        await super()._stop(reason, signum, kill_now)

    def _on_rendezvous_event(self, event: RendezvousEvent) -> None:
        """The node that finds its ring successor's heartbeat gone logs it lost at once: the
        survivors' next generation need not wait for the next round (``last_call_timeout``)."""
        if isinstance(event, RendezvousNodeLost) and self.running:
            now = anyio.current_time()
            with contextlib.suppress(anyio.ClosedResourceError):  # the attempt just ended
                for lost in self.replica.saw_node_lost(event.lost):
                    self._record(lost, now)

    def new_round(self, records: Sequence[NodeRecord], round_: int) -> tuple[Outcome, str] | None:
        """A later round completed while the epoch runs: nodes gone from it are lost (their
        workers leave the world, the survivors go on); an outcome if this node must leave."""
        plan = plan_epoch(self.node, records, round_)
        if plan.action != "stay":  # no failure of its workers: it costs no restart
            return Outcome.MEMBERSHIP, (
                f"this node's in-place epoch {self.epoch} is not the job's live one "
                f"({plan.epoch}); its workers stop and it joins that one"
            )
        now = anyio.current_time()
        for event in self.replica.saw_round(plan.members):
            self._record(event, now)
        return None

    # -- hooks of WorkerGroup.run ---------------------------------------------------------------

    def _start_workers(self, pumps: TaskGroup, watchers: TaskGroup) -> None:
        self._pumps, self._watchers = pumps, watchers
        now = anyio.current_time()
        ran = self.epochs_run
        ran_it = ran is None or self.epoch in ran
        if ran is not None:
            ran.add(self.epoch)
        if self._plan is not None and self._plan.action == "join":
            # A joining node's workers are started when its NodeJoined is read back.
            spec = g.NodeSpec(self.spec.local_world_size, self.spec.spares)
            for event in self.replica.join(self._begin, spec, now, ran_it=ran_it):
                self._record(event, now)
            return
        self._apply(self.replica.begin(self._begin, now))
        first = [w for w in self._linked.values() if w.key.serial < self.spec.local_world_size]
        self._emit(
            WorkersStarted(
                self.info.restart_count,
                tuple(w.worker.ranks.rank for w in first),
                tuple(w.worker.process.pid for w in first),
            )
        )

    async def _wait_workers(self) -> tuple[Outcome, str]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._log.follow)
            tg.start_soon(self._show_generation)
            ended = await self._drive()
            tg.cancel_scope.cancel()
        return ended

    def show_in(self, store: Store, group_rank: int) -> None:
        """Show this node's generation in ``store`` as ``group_rank`` from now on (a later
        round's, under in-place recovery across nodes)."""
        self.store, self.status_rank = store, group_rank
        self._shown.set()

    async def _show_generation(self) -> None:
        """Keep this node's generation and spares in :attr:`store` (``aioelastic status``
        reads it)."""
        shown: tuple[Store | None, int, bytes] = (None, 0, b"")
        while True:
            await self._shown.wait()
            self._shown = anyio.Event()
            store, rank = self.store, self.status_rank
            if self.replica.machine is None:
                continue
            value = encode_generation(self.replica.machine, self._linked_pids())
            if store is not None and (store, rank, value) != shown:
                try:
                    await store.set(g.generation_key(rank), value)
                    shown = (store, rank, value)
                except StoreError as exc:  # the status display is not worth failing a job
                    logger.info("could not show generation in the store: %s", exc)

    @property
    def returncodes(self) -> dict[int, int]:
        """Exit status by local rank, of each rank's final holder (a replacement, not the
        worker it replaced; never an idle spare, which holds no rank), once it has exited."""
        codes = {}
        for slot, key in sorted(self.machine.holders(self.node).items()):
            linked = self._linked.get(key)
            if linked is not None and linked.worker.process.returncode is not None:
                codes[slot] = linked.worker.process.returncode
        return codes

    def _linked_pids(self) -> dict[g.WorkerKey, int]:
        own = {key: linked.worker.process.pid for key, linked in self._linked.items()}
        return {**self._remote_pids, **own}

    def _pid_of(self, key: g.WorkerKey) -> int:
        """The pid of worker ``key`` (0 where this agent never learned it)."""
        linked = self._linked.get(key)
        return linked.worker.process.pid if linked is not None else self._remote_pids.get(key, 0)

    # -- the loop: notices in, commands out -----------------------------------------------------

    async def _drive(self) -> tuple[Outcome, str]:
        heard: MemoryObjectReceiveStream[Notice] = self._heard
        while True:
            notice: Notice | None = None
            due = math.inf if self.draining else self.replica.next_due()
            with anyio.move_on_after(max(0.0, due - anyio.current_time())):
                notice = await heard.receive()
            if self.draining:
                drained = self._drain(notice)
                if drained is not None:
                    return drained
                continue
            now = anyio.current_time()
            if notice is None:
                commands: list[g.Command] = []
                for event in self.replica.due(now):
                    commands += self._record(event, now)
            else:
                commands = self._hear(notice, now)
            ended = self._apply(commands)
            self._shown.set()
            reports, self._reports = self._reports, []
            for report in reports:  # after the survivors were told: reports cost file I/O
                self._emit(report())
            if ended is not None:
                return ended

    def _drain(self, notice: Notice | None) -> tuple[Outcome, str] | None:
        """The job is preempted: the world stops changing (an exit is the preemption's, not a
        failure to recover from); the attempt ends once every slot's holder exited (the
        group's stop ends the idle spares)."""
        if isinstance(notice, _Exit):
            worker = self._linked[notice.key].worker
            if worker.process.returncode == 0:
                ranks = worker.ranks
                self._emit(WorkerSucceeded(ranks.local_rank, ranks.rank, worker.process.pid))
        holders = self._holders()
        if any(w.process.returncode is None for w in holders):
            return None
        failed = any(w.process.returncode != 0 for w in holders)
        return Outcome.FAILED if failed else Outcome.SUCCEEDED, "every rank exited, preempted"

    def _holders(self) -> list[_Worker]:
        """This node's workers that hold a slot now (never an idle spare)."""
        keys = self.machine.holders(self.node).values()
        return [self._linked[key].worker for key in keys if key in self._linked]

    def _record(self, event: g.Event, now: float, *, pid: int | None = None) -> list[g.Command]:
        """Put ``event`` in the world's log; what to do now (on one node, what it means at
        once; across nodes nothing yet: it comes back through the log, in the log's order)."""
        entry = self._log.append(event, pid)
        return [] if entry is None else self._feed(entry, now)

    def _feed(self, entry: g.LogEntry, now: float) -> list[g.Command]:
        event = entry.event
        if isinstance(event, g.Ready) and entry.pid is not None:
            self._remote_pids[event.worker] = entry.pid
        try:
            commands = self.replica.feed(entry, now)
        except g.GenerationProtocolError as exc:
            if not self._log.replicated:
                raise
            logger.warning("generation log entry refused: %s", exc)  # every replica alike
            return []
        if isinstance(event, g.Ready):  # a spare of this node may be ready now: warm it
            self._warm_spares()
        return commands

    def _hear(self, notice: Notice, now: float) -> list[g.Command]:
        if isinstance(notice, _Logged):
            return self._feed(notice.entry, now)
        linked = self._linked[notice.key]
        if isinstance(notice, _Exit):
            return self._exited(linked, now)
        if isinstance(notice, _Answered):
            self._answered(linked, notice.reply, now)
            return []
        replica = self.replica
        match notice.message:
            case Hello():
                event = replica.saw_hello(linked.key)
                commands = self._record(event, now, pid=linked.worker.process.pid)
                self._warm_spares()
                return commands
            case Loaded(names=names):
                self._learn(names)
                return []
            case Enter(generation=number):
                return self._record(replica.saw_enter(linked.key, number), now)
            case Trouble(generation=number):
                commands = []
                for event in replica.saw_trouble(linked.key, number, now):
                    commands += self._record(event, now)
                return commands
            case other:
                logger.warning("worker %s sent an agent's message %r; ignored", linked.key, other)
                return []

    def _learn(self, names: Sequence[str]) -> None:
        """Add what a worker reported it had loaded to :attr:`warm_modules`; warm the spares."""
        assert self.warm_modules is not None
        known = self._known_modules
        new = [name for name in names if name not in known]
        if new:
            known.update(new)
            self.warm_modules += new
            self._warm_spares()

    def _warm_spares(self) -> None:
        """Send each idle spare of this node the learned modules it was not sent yet."""
        modules = self.warm_modules or []
        if self.replica.machine is None:
            return
        for key in self.replica.machine.spares(self.node):
            sent = self._warmed.get(key, 0)
            if key in self._linked and sent < len(modules):
                for message in chunked(Warm, modules[sent:]):
                    self._send(key, message)
                self._warmed[key] = len(modules)

    def _exited(self, linked: _Linked, now: float) -> list[g.Command]:
        worker = linked.worker
        code = worker.process.returncode
        assert code is not None
        event = self.replica.saw_exit(linked.key, code)
        if code == 0:
            self._emit(
                WorkerSucceeded(worker.ranks.local_rank, worker.ranks.rank, worker.process.pid)
            )
        elif self.replica.live:
            self.reported.add(worker.process.pid)
            self._reports.append(lambda: WorkerFailed(self._failure_of(worker)))
        return self._record(event, now)

    def _answered(self, linked: _Linked, reply: AbortReply, now: float) -> None:
        """A survivor said what it did about its ended world's collectives."""
        if reply.outcome is AbortOutcome.NOTHING:
            return
        worker = linked.worker
        self._emit(
            CollectivesAborted(
                worker.ranks.rank,
                worker.ranks.local_rank,
                worker.process.pid,
                reply.generation,
                reply.outcome.value,
                reply.detail,
            )
        )
        if reply.outcome is AbortOutcome.UNAVAILABLE:
            self.replica.saw_cannot_abort(linked.key, reply.generation, reply.detail, now)

    # -- from the replica to the world ------------------------------------------------------------

    def _apply(self, commands: list[g.Command]) -> tuple[Outcome, str] | None:
        """Do what the replica said, in its order (workers told first, processes started
        next, reports last); an outcome once the attempt ends."""
        for command in commands:
            match command:
                case g.Spawn():
                    self._spawn_linked(command.worker, command.slot)
                case g.Assign():
                    place = command.place
                    linked = self._linked[command.worker]
                    linked.worker.ranks = WorkerRanks(  # what its events and reports say
                        place.local_rank, place.rank, place.world_size, place.rank, place.world_size
                    )
                    self._retitle(linked.worker, place)
                    self._send(command.worker, self._world_message(place))
                case g.EndWorld():
                    for key in command.workers:
                        self._send(key, WorldEnded(command.generation, command.reason))
                        if command.abort:
                            self._ask_abort(key, command.generation)
                case g.Evict():
                    self._evict(command)
                case g.OwnError():
                    self._send(command.worker, StillValid(command.generation))
                case g.Stop():
                    self._send(command.worker, NoMoreWorlds("the job finished"))
                case g.GenerationAssigned():
                    generation = command.generation
                    self._emit(
                        GenerationAssigned(
                            generation.number,
                            generation.world_size,
                            generation.reason,
                            self._pids(generation),
                            self._replaced(command.replacements),
                        )
                    )
                case g.GenerationFormed():
                    generation = command.generation
                    self._emit(
                        GenerationFormed(
                            generation.number,
                            generation.world_size,
                            generation.reason,
                            self._pids(generation),
                            self._replaced(command.replacements),
                            command.since_failure,
                        )
                    )
                case g.NodeOut():  # no failure of its workers: it costs no restart
                    return Outcome.MEMBERSHIP, (
                        f"the job took this node for lost ({command.reason}); its workers stop "
                        "and it joins again"
                    )
                case g.FallBack():
                    self._emit(RecoveryFellBack(command.reason))
                    return Outcome.FAILED, f"in-place recovery fell back: {command.reason}"
                case g.Finish():
                    return Outcome.SUCCEEDED, "all workers succeeded"
        return None

    def _evict(self, command: g.Evict) -> None:
        """Kill a member the machine took out (it is replaced like a failed one)."""
        linked = self._linked.get(command.worker)
        if linked is None:
            return
        worker = linked.worker
        if command.cause is g.EvictCause.HUNG:
            evicted: AgentEvent = WorkerEvicted(
                worker.ranks.rank, worker.ranks.local_rank, worker.process.pid, command.reason
            )
        else:
            evicted = WorkerRestartedToLeave(
                worker.ranks.rank,
                worker.ranks.local_rank,
                worker.process.pid,
                command.generation,
                command.cause,
                command.reason,
            )
        self._emit(evicted)
        self.reported.add(worker.process.pid)
        worker.process.signal_group(signal.SIGKILL)

    def _world_message(self, place: g.Place) -> WorldAssigned:
        return WorldAssigned(
            **dataclasses.asdict(place),
            store=self._log.world_store(place.generation),
            timeout=self.spec.recovery_timeout / 2,
        )

    def bystanders(self) -> set[int]:
        """The idle spares: a preemption leaves them waiting (the group's stop ends them)."""
        holding = {w.process.pid for w in self._holders()}
        return {w.process.pid for w in self.workers} - holding

    def _pids(self, generation: g.Generation) -> tuple[int, ...]:
        return tuple(self._pid_of(key) for key in generation.members)

    def _replaced(self, replacements: tuple[g.Replacement, ...]) -> tuple[ReplacedWorker, ...]:
        return tuple(
            ReplacedWorker(
                rank=r.rank,
                local_rank=r.slot,
                failed_pid=None if r.replaced is None else self._pid_of(r.replaced),
                pid=self._pid_of(r.by),
                by_spare=r.spare,
            )
            for r in replacements
        )
