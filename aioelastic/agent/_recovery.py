"""The shell of in-place recovery: processes and links in, generations out.

:class:`InPlaceGroup` is the :class:`~aioelastic.agent._group.WorkerGroup` of an attempt under
``--recovery in-place``. It runs the pure :class:`~aioelastic.agent._generations.GenerationMachine`
and does what it says: start workers and warm spares (each linked to the agent by a socket
pair, see ``aioelastic/worker/_protocol.py``), tell them their places and the ends of their
worlds, report. What it feeds the machine comes from pidfds (a death is seen at once, no
heartbeat), the links (hello, entered, trouble) and the machine's own deadline. The attempt
ends when the machine finishes (every member exited 0) or falls back (then the agent restarts
the group, costing a restart, exactly as ``--recovery restart`` would).

Each generation gets its own store: a prefix of a store the attempt serves on loopback
(:class:`~aioelastic.store.TCPStoreServer`, which speaks torch's ``TCPStore`` protocol and
ours on one port), so no worker binds a port, no worker's death takes the store away, and two
generations never share keys.
A worker that asks nothing of the API is an ordinary worker: see the machine's WAITING phase.

Across nodes, :class:`SharedInPlaceGroup` does the same with one replica of the job's machine
per agent, fed from a log in the job's store (see "many nodes" below).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioelastic.agent import _generations as g
from aioelastic.agent._env import RoundInfo, WorkerRanks
from aioelastic.agent._events import (
    AgentEvent,
    CollectivesAborted,
    GenerationAssigned,
    GenerationFormed,
    RecoveryFellBack,
    ReplacedWorker,
    SpareStarted,
    WorkerEvicted,
    WorkerFailed,
    WorkerRestartedToLeave,
    WorkersStarted,
    WorkerSucceeded,
)
from aioelastic.agent._group import Outcome, WorkerGroup, _Worker
from aioelastic.agent._leaving import LeaveDeadlines
from aioelastic.agent._logs import line_prefix
from aioelastic.agent._spec import WorkerSpec
from aioelastic.rendezvous import NodeLost as RendezvousNodeLost
from aioelastic.rendezvous import RendezvousEvent, RendezvousInfo
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.store import PrefixStore, Store, StoreError, TCPStoreServer, TorchStoreListener
from aioelastic.worker._abort import (
    ABORT_FD_ENV,
    AbortLines,
    AbortOutcome,
    AbortReply,
    AbortRequest,
    encode_abort,
)
from aioelastic.worker._protocol import (
    WORKER_FD_ENV,
    Enter,
    Hello,
    LineDecoder,
    Lines,
    LinkProtocolError,
    Loaded,
    Message,
    NoMoreWorlds,
    StillValid,
    Trouble,
    Warm,
    WorldAssigned,
    WorldEnded,
    chunked,
    encode,
)

logger = logging.getLogger(__name__)

_M = TypeVar("_M")


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


SPARE_ENV = {"RANK": "-1", "LOCAL_RANK": "-1", "ROLE_RANK": "-1", "AIOELASTIC_SPARE": "1"}
"""What a spare's environment says of its ranks until it is placed: it holds none (-1, so
``init_process_group("env://")`` in a spare fails instead of joining as someone's rank);
``worker.worlds()`` sets the ranks of each world it yields."""

VERDICT_GRACE = 2.0
"""How long a worker whose ``with world:`` raised waits to hear that its world ended before the
exception counts as its own (a peer's death reaches the agent through its pidfd within
milliseconds; a collective's error can come first)."""


CANNOT_ABORT_GRACE = 2.0
"""How long a survivor that cannot abort its collectives (its backend has no abort) is given
to leave its ended world by itself (it may not be in a collective) before it is restarted."""


@dataclass(frozen=True, slots=True)
class _Exit:
    key: g.WorkerKey


@dataclass(frozen=True, slots=True)
class _Said:
    key: g.WorkerKey
    message: Message


@dataclass(frozen=True, slots=True)
class _Logged:
    entry: g.LogEntry


@dataclass(frozen=True, slots=True)
class _Answered:
    key: g.WorkerKey
    reply: AbortReply


_Notice = _Exit | _Said | _Logged | _Answered


@dataclass(slots=True)
class _Verdict:
    """A troubled worker waiting for its world's verdict: when it is due, whether it is the
    final one (else an early look for hung peers), when the worker asked."""

    generation: int
    due: float
    final: bool
    asked_at: float


@dataclass(slots=True)
class _Linked:
    key: g.WorkerKey
    worker: _Worker
    link: socket.socket
    abort: socket.socket
    """Where the agent asks the worker to abort its collectives (see worker/_abort.py)."""
    unsent: bytes = b""
    """What the link's buffer did not take yet (sent, in order, once it is writable)."""


class InPlaceGroup(WorkerGroup):
    """This node's workers under in-place recovery (see the module docstring)."""

    first_generation = 1
    """The number of this attempt's first generation (numbers go on across attempts)."""
    store: Store | None = None
    """Where the node's generation is shown (``aioelastic status``), if anywhere."""
    warm_modules: list[str] | None = None
    """The modules this node's workers had loaded by their first step, in import order (each
    reports them once, see ``aioelastic/worker/_warm.py``): what its idle spares import.
    :class:`Attempts` shares one list across attempts; a group without one keeps its own."""

    def verdict_grace(self) -> float:
        """How long a troubled worker waits for its world's end before its error counts as its
        own (a peer's death on this node reaches the agent through its pidfd at once)."""
        return VERDICT_GRACE

    def leave_timeout(self) -> float:
        """How long a survivor has to enter its next world once told the last one ended,
        before it is restarted: its collectives' own timeout (a worker that cannot abort
        leaves by then too)."""
        return self.spec.recovery_timeout / 2

    def _setup(self) -> None:
        node = self.node = self.info.group_rank
        self.machine = g.GenerationMachine(
            {node: g.NodeSpec(self.spec.local_world_size, self.spec.spares)},
            recovery_timeout=self.spec.recovery_timeout,
            first_generation=self.first_generation,
        )
        self._setup_links()

    def _setup_links(self) -> None:
        self.status_rank = self.info.group_rank
        self._linked: dict[g.WorkerKey, _Linked] = {}
        self._verdicts: dict[g.WorkerKey, _Verdict] = {}
        self._failed_at: dict[g.WorkerKey, float] = {}
        self._tell, self._heard = anyio.create_memory_object_stream[_Notice](math.inf)
        self._reports: list[AgentEvent] = []
        self._later: list[g.Spawn] = []
        self._leaving = LeaveDeadlines(self.leave_timeout(), CANNOT_ABORT_GRACE)
        self._shown = anyio.Event()
        if self.warm_modules is None:
            self.warm_modules = []
        self._known_modules = set(self.warm_modules)
        self._warmed: dict[g.WorkerKey, int] = {}

    async def run(
        self,
        other: Callable[[], Awaitable[tuple[Outcome, str]]],
        *,
        shutdown: Callable[[], int | None],
        kill_now: anyio.Event,
    ) -> tuple[Outcome, str]:
        self._setup()
        try:
            async with self._worlds_served():
                with self._tell, self._heard:
                    return await super().run(other, shutdown=shutdown, kill_now=kill_now)
        finally:
            for linked in self._linked.values():
                linked.link.close()
                linked.abort.close()

    @asynccontextmanager
    async def _worlds_served(self) -> AsyncIterator[None]:
        """Serve the generations' stores while the attempt runs."""
        async with TCPStoreServer("127.0.0.1", 0) as self._worlds_store:
            yield

    # -- hooks of WorkerGroup.run ---------------------------------------------------------------

    def _start_workers(self, pumps: TaskGroup, watchers: TaskGroup) -> None:
        self._pumps, self._watchers = pumps, watchers
        self._apply(self.machine.start(anyio.current_time()))
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
            value = encode_generation(self.machine, self._linked_pids())
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
        return {key: linked.worker.process.pid for key, linked in self._linked.items()}

    def _pid_of(self, key: g.WorkerKey) -> int:
        """The pid of worker ``key`` (0 where this agent never learned it)."""
        linked = self._linked.get(key)
        return linked.worker.process.pid if linked is not None else 0

    def _record(self, event: g.Event, now: float, *, pid: int | None = None) -> list[g.Command]:
        """Feed ``event`` to the machine; return what to do now (see the shared group)."""
        return self.machine.send(event, now)

    def _next_deadline(self) -> float:
        return self.machine.deadline

    def _on_deadline(self, now: float) -> list[g.Command]:
        return self.machine.send(g.Tick(), now)

    async def _drive(self) -> tuple[Outcome, str]:
        heard: MemoryObjectReceiveStream[_Notice] = self._heard
        while True:
            due = min(
                [
                    self._next_deadline(),
                    *(verdict.due for verdict in self._verdicts.values()),
                    self._leaving.next_due(),
                ]
            )
            notice: _Notice | None = None
            with anyio.move_on_after(max(0.0, due - anyio.current_time())):
                notice = await heard.receive()
            now = anyio.current_time()
            if notice is None:
                commands = self._give_verdicts(now) + self._leaves_due(now)
                commands += self._on_deadline(now)
            else:
                commands = self._hear(notice, now)
            ended = self._apply(commands)
            self._shown.set()
            reports, self._reports = self._reports, []
            for event in reports:  # after the survivors were told: reports cost file writes
                self._emit(event)
            if ended is not None:
                return ended

    # -- from the world to the machine ------------------------------------------------------------

    def _hear(self, notice: _Notice, now: float) -> list[g.Command]:
        if isinstance(notice, _Logged):  # only a shared group follows a log
            return []
        linked = self._linked[notice.key]
        if isinstance(notice, _Exit):
            self._leaving.forget(linked.key)
            return self._exited(linked, now)
        if isinstance(notice, _Answered):
            self._answered(linked, notice.reply, now)
            return []
        match notice.message:
            case Hello():
                commands = self._record(g.Ready(linked.key), now, pid=linked.worker.process.pid)
                self._warm_spares()
                return commands
            case Loaded(names=names):
                self._learn(names)
                return []
            case Enter(generation=number):
                self._leaving.entered(linked.key, number)
                return self._record(g.Entered(linked.key, number), now)
            case Trouble(generation=number):
                current = self.machine.generation
                if current is None or current.number != number:
                    return []  # a world that already ended: the end answers it
                early = self.verdict_grace() > VERDICT_GRACE  # a first look for hung peers
                grace = VERDICT_GRACE if early else self.verdict_grace()
                self._verdicts[linked.key] = _Verdict(number, now + grace, not early, now)
                return self._record(g.Troubled(linked.key, number), now)
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
        for key in self.machine.spares(self.node):
            sent = self._warmed.get(key, 0)
            if key in self._linked and sent < len(modules):
                for message in chunked(Warm, modules[sent:]):
                    self._send(key, message)
                self._warmed[key] = len(modules)

    def _exited(self, linked: _Linked, now: float) -> list[g.Command]:
        worker = linked.worker
        code = worker.process.returncode
        assert code is not None
        self._verdicts.pop(linked.key, None)
        if code == 0:
            self._emit(
                WorkerSucceeded(worker.ranks.local_rank, worker.ranks.rank, worker.process.pid)
            )
        elif self.machine.phase not in (g.Phase.FINISHED, g.Phase.FELL_BACK):
            self._failed_at[linked.key] = now
            self.reported.add(worker.process.pid)
            self._reports.append(WorkerFailed(self._failure_of(worker)))
        return self._record(g.Exited(linked.key, code), now)

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
            self._leaving.cannot_abort(linked.key, reply.generation, reply.detail, now)

    def _leaves_due(self, now: float) -> list[g.Command]:
        """Report the survivors whose time to leave their ended world passed (the machine
        says whether they are still stuck there)."""
        commands: list[g.Command] = []
        for due in self._leaving.due(now):
            commands += self._record(due, now)
        return commands

    def _give_verdicts(self, now: float) -> list[g.Command]:
        """Report the troubled workers whose grace passed (the machine decides: evict the
        likely hung peers, or tell the asker its error is its own). A final verdict waits on
        while a peer told "still valid" is failing (its exit breaks the others' collectives
        before the agent sees it), up to ``recovery_timeout`` since the asking."""
        commands: list[g.Command] = []
        for key, verdict in list(self._verdicts.items()):
            if verdict.due > now or self._verdicts.get(key) is not verdict:
                continue
            del self._verdicts[key]
            number = verdict.generation
            if not verdict.final:
                final = _Verdict(
                    number, verdict.asked_at + self.verdict_grace(), True, verdict.asked_at
                )
                self._verdicts[key] = final
            elif (
                self.machine.condemned_alive(key)
                and now - verdict.asked_at < self.spec.recovery_timeout
            ):
                self._verdicts[key] = _Verdict(number, now + VERDICT_GRACE, True, verdict.asked_at)
                continue
            commands += self._record(g.VerdictDue(key, number, verdict.final), now)
        return commands

    # -- from the machine to the world ------------------------------------------------------------

    def _apply(self, commands: list[g.Command]) -> tuple[Outcome, str] | None:
        """Do what the machine said: tell the workers first, then start processes, then
        report. A new spare starts once the generation formed: starting a process holds this
        loop, which also serves the world's store, for tens of milliseconds on a busy host."""
        told = g.Assign | g.EndWorld | g.Stop | g.Evict | g.OwnError
        urgent = [c for c in commands if isinstance(c, told)]
        spawns = [c for c in commands if isinstance(c, g.Spawn)]
        rest = [c for c in commands if not isinstance(c, told | g.Spawn)]
        for command in [*urgent, *spawns, *rest]:
            if not self._concerns_me(command):
                continue
            match command:
                case g.Spawn(slot=None) if self.machine.phase is g.Phase.FORMING:
                    self._later.append(command)  # a new spare waits until the world formed
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
                    now = anyio.current_time()
                    for key in (k for k in command.workers if k.node == self.node):
                        self._verdicts.pop(key, None)
                        self._send(key, WorldEnded(command.generation, command.reason))
                        if command.abort:
                            self._ask_abort(key, command.generation)
                        self._leaving.ended(key, command.generation, now)
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
                    later, self._later = self._later, []
                    for spawn in later:
                        self._spawn_linked(spawn.worker, spawn.slot)
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

    def _concerns_me(self, command: g.Command) -> bool:
        """Whether this node acts on ``command`` (each node starts and tells only its own)."""
        if isinstance(command, g.Spawn | g.Assign | g.Stop | g.Evict | g.OwnError):
            return command.worker.node == self.node
        if isinstance(command, g.NodeOut):
            return command.node == self.node
        return True

    def _ask_abort(self, key: g.WorkerKey, generation: int) -> None:
        """Ask a survivor to abort the collectives of ``generation``, which lost a member."""
        linked = self._linked.get(key)
        if linked is None:
            return
        try:
            linked.abort.send(encode_abort(AbortRequest(generation)))
        except OSError as exc:  # gone: its pidfd says so
            logger.info("could not ask worker %s to abort: %s", key, exc)

    def _evict(self, command: g.Evict) -> None:
        """Kill a member the machine took out (it is replaced like a failed one)."""
        linked = self._linked.get(command.worker)
        self._leaving.forget(command.worker)
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
            store=self._world_store(place.generation),
            timeout=self.spec.recovery_timeout / 2,
        )

    def _world_store(self, generation: int) -> dict[str, Any]:
        """Where generation ``generation``'s store is, as a worker opens it."""
        return {
            "kind": "tcp",
            "host": self._worlds_store.host,
            "port": self._worlds_store.port,
            "prefix": f"aioelastic/{self.info.restart_count}/gen{generation}",
        }

    def bystanders(self) -> set[int]:
        """The spares: a preemption leaves them waiting (the group's stop ends them)."""
        generation = self.machine.generation
        members = set() if generation is None else set(self._pids(generation))
        return {w.process.pid for w in self.workers} - members

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

    def _send(self, key: g.WorkerKey, message: Message) -> None:
        """Tell a worker something; a worker that is gone will be heard of through its pidfd."""
        linked = self._linked.get(key)
        if linked is None:  # a worker of an earlier life of this node (a replica replayed it)
            return
        data = encode(message)
        if linked.unsent:  # after what is waiting, never in the middle of it
            linked.unsent += data
            return
        try:
            sent = linked.link.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            logger.info("could not tell worker %s %s: %s", key, type(message).__name__, exc)
            return
        if sent < len(data):  # a full buffer (a long Warm list): the rest goes when it drains
            linked.unsent = data[sent:]
            scope = anyio.CancelScope(shield=True)  # bounded like the pumps
            self._pump_scopes.append(scope)
            self._pumps.start_soon(self._send_unsent, linked, scope)

    @staticmethod
    async def _send_unsent(linked: _Linked, scope: anyio.CancelScope) -> None:
        """Send what the link's buffer did not take, as it drains (the worker reads)."""
        with scope:
            while linked.unsent:
                await anyio.wait_writable(linked.link)
                try:
                    sent = linked.link.send(linked.unsent)
                except BlockingIOError:
                    continue
                except OSError as exc:  # gone: its pidfd says so
                    logger.info("could not tell worker %s the rest: %s", linked.key, exc)
                    linked.unsent = b""
                    return
                linked.unsent = linked.unsent[sent:]

    # -- processes and links --------------------------------------------------------------------

    def _ranks_for(self, slot: int | None) -> WorkerRanks:
        """The ranks ``slot`` is started with (a spare: slot 0's, for its streams and binding;
        its environment and console say it holds none, see :data:`SPARE_ENV`)."""
        return self.ranks[slot or 0]

    def _retitle(self, worker: _Worker, place: g.Place) -> None:
        """Show ``worker``'s console lines under the rank it now holds (a spare placed, or a
        survivor whose rank changed)."""
        prefix = line_prefix(
            self.spec.logs.line_prefix,
            rank=place.rank,
            local_rank=place.local_rank,
            role_name=self.spec.role,
        )
        for pump in worker.pumps:
            pump.retitle(prefix)

    def _spawn_linked(self, key: g.WorkerKey, slot: int | None) -> None:
        ours, theirs = socket.socketpair()
        abort, their_abort = socket.socketpair()
        env = {
            WORKER_FD_ENV: str(theirs.fileno()),
            ABORT_FD_ENV: str(their_abort.fileno()),
            "AIOELASTIC_RECOVERY": "in-place",
            **(SPARE_ENV if slot is None else {}),
        }
        try:
            worker = self._spawn(
                self._ranks_for(slot),
                self._pumps,
                tag=f"{slot if slot is not None else 'spare'}.{key.serial}",
                extra_env=env,
                pass_fds=(theirs.fileno(), their_abort.fileno()),
                shown_as="spare" if slot is None else None,
            )
        except BaseException:
            ours.close()
            abort.close()
            raise
        finally:
            theirs.close()
            their_abort.close()
        ours.setblocking(False)
        abort.setblocking(False)
        self.workers.append(worker)
        self._linked[key] = _Linked(key, worker, ours, abort)
        self._watchers.start_soon(self._watch_linked, key)
        scopes = [anyio.CancelScope(shield=True) for _ in range(2)]  # bounded like the pumps
        self._pump_scopes += scopes
        self._pumps.start_soon(self._read_link, key, scopes[0])
        self._pumps.start_soon(self._read_abort_answers, key, scopes[1])
        if slot is None:
            self._emit(SpareStarted(worker.process.pid))

    async def _watch_linked(self, key: g.WorkerKey) -> None:
        worker = self._linked[key].worker
        with anyio.CancelScope(shield=True):  # as WorkerGroup._watch: _stop() ends every worker
            await worker.process.watch()
        worker.ended_at = time.monotonic()
        tell: MemoryObjectSendStream[_Notice] = self._tell
        tell.send_nowait(_Exit(key))

    async def _read_link(self, key: g.WorkerKey, scope: anyio.CancelScope) -> None:
        def heard(message: Message) -> None:
            self._tell.send_nowait(_Said(key, message))

        await self._read_lines(key, self._linked[key].link, LineDecoder(), heard, "link", scope)

    async def _read_abort_answers(self, key: g.WorkerKey, scope: anyio.CancelScope) -> None:
        def heard(message: AbortRequest | AbortReply) -> None:
            if isinstance(message, AbortReply):
                self._tell.send_nowait(_Answered(key, message))

        sock = self._linked[key].abort
        await self._read_lines(key, sock, AbortLines(), heard, "abort answers", scope)

    @staticmethod
    async def _read_lines(
        key: g.WorkerKey,
        sock: socket.socket,
        lines: Lines[_M],
        heard: Callable[[_M], None],
        what: str,
        scope: anyio.CancelScope,
    ) -> None:
        """Hand each message ``sock`` brings to ``heard`` until the worker's end closes (or
        speaks another protocol: then it is ignored)."""
        with scope:
            while True:
                await anyio.wait_readable(sock)
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    return  # the worker (and whatever inherited its end) exited
                try:
                    messages = lines.feed(data)
                except LinkProtocolError as exc:
                    logger.warning("worker %s: %s; ignoring its %s from now on", key, exc, what)
                    return
                for message in messages:
                    heard(message)


# -- many nodes -------------------------------------------------------------------------------
# Across nodes, every agent runs a replica of one machine for the whole job (see "the replicated
# log" in _generations.py). An *epoch* is one such machine's life: it begins in a rendezvous
# round in which no node runs in-place workers (its number is that round's), and it lives on
# through later rounds (nodes lost or joining) until it finishes or falls back to a restart.
# Each round, every node writes a :class:`NodeRecord` next to its slot in the round's store;
# :func:`plan_epoch` then tells each node, alike, whether to begin an epoch, stay in its own,
# join the live one, or leave a stale one.

INPLACE_RECORD_PREFIX = "aioelastic/agent/inplace/"
"""In a round's store, where each group rank's :class:`NodeRecord` goes."""

LEAVE_NOTICE_TIMEOUT = 2.0
"""How long a node stopped by a signal may spend logging that it leaves (then it stops its
workers anyway: the others find it gone by its heartbeat)."""

LOG_RETRY_PAUSE = 0.5
"""After a failed store call on the generation log, the pause before trying again (the
rendezvous fences this node if its store stays away)."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a node says about itself in a round, under in-place recovery across nodes."""

    node: int
    """Its rendezvous node id (stable while its agent lives)."""
    spec: g.NodeSpec
    epoch: int
    """The epoch its workers run in (0: none: it has no in-place workers running)."""
    last_generation: int
    """The highest generation number it has seen (numbers go on across epochs)."""

    def encode(self) -> bytes:
        spec = [self.spec.local_world_size, self.spec.spares]
        return json.dumps([self.node, spec, self.epoch, self.last_generation]).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NodeRecord:
        try:
            node, (size, spares), epoch, last = json.loads(raw)
            return cls(int(node), g.NodeSpec(int(size), int(spares)), int(epoch), int(last))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"bad in-place node record {raw[:200]!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """What one node does with a round (see :func:`plan_epoch`)."""

    action: str
    """``begin`` a new epoch, ``stay`` in its own, ``join`` the live one, ``leave`` a stale one."""
    epoch: int
    begin: g.Begin | None = None
    """For ``begin``: the log's first entry (every node computes the same)."""
    members: frozenset[int] = frozenset()
    """The nodes of the round."""


def plan_epoch(node: int, records: Sequence[NodeRecord], round_: int) -> EpochPlan:
    """Decide, as every node of round ``round_`` decides alike, what ``node`` does.

    No node runs an epoch: they begin one numbered ``round_`` with every node of the round.
    Otherwise the newest live epoch goes on: its nodes stay, nodes without one join it, and a
    node of an older epoch leaves it (its workers stop; it joins afresh next round).
    """
    members = frozenset(r.node for r in records)
    mine = next(r for r in records if r.node == node)
    live = max((r.epoch for r in records), default=0)
    if live == 0:
        first = 1 + max(r.last_generation for r in records)
        begin = g.Begin({r.node: r.spec for r in records}, first)
        return EpochPlan("begin", round_, begin, members)
    if mine.epoch == live:
        return EpochPlan("stay", live, members=members)
    if mine.epoch == 0:
        return EpochPlan("join", live, members=members)
    return EpochPlan("leave", mine.epoch, members=members)


def job_store(info: RendezvousInfo) -> Store | None:
    """The run's store under a round's (``store/<round>`` of the elastic handlers), where the
    generation log outlives rounds; None for a backend that has no such layout."""
    store = info.store
    if isinstance(store, PrefixStore) and store.prefix == f"store/{info.round}":
        return store.store
    return None


class SharedInPlaceGroup(InPlaceGroup):
    """This node's workers in a job's world over many nodes (see "many nodes" above).

    What this node sees (its workers asking, entering, exiting; nodes lost; deadlines) is
    appended to the epoch's log; what the log says, in its order, is fed to this node's replica,
    which says what to do here. The world's store is served on loopback to this node's workers
    and kept in the job's store, so workers of every node meet in it.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        info: RoundInfo,
        ranks: list[WorkerRanks],
        *,
        job: Store,
        node: int,
        records: Sequence[NodeRecord],
        round_: int,
        **options: Any,
    ) -> None:
        super().__init__(spec, info, ranks, **options)
        self._job = job
        self._node_id = node
        self._plan = plan_epoch(node, records, round_)
        self.epoch = self._plan.epoch
        self.running = False
        self._token = f"{node}-{uuid.uuid4().hex[:12]}"

    @property
    def live(self) -> bool:
        """Whether this group runs its epoch still (not finished, not fallen back)."""
        machine = getattr(self, "machine", None)
        return self.running and (machine is None or machine.phase not in g.TERMINAL_PHASES)

    def verdict_grace(self) -> float:
        """A peer's death on another node is known once its agent or the rendezvous says so."""
        return self.spec.recovery_timeout

    def _setup(self) -> None:
        self.node = self._node_id
        self._setup_links()
        self._remote_pids: dict[g.WorkerKey, int] = {}
        self._began = self._plan.action == "begin"
        self._replaying = not self._began
        self._next = 0
        self._append_at = 0
        self._serial = 0
        self._timed_out: set[int] = set()
        self._to_append, self._appends = anyio.create_memory_object_stream[
            tuple[g.Event, int | None]
        ](math.inf)

    async def run(
        self,
        other: Callable[[], Awaitable[tuple[Outcome, str]]],
        *,
        shutdown: Callable[[], int | None],
        kill_now: anyio.Event,
    ) -> tuple[Outcome, str]:
        if self._plan.action not in ("begin", "join"):
            raise AssertionError(f"a new group cannot {self._plan.action} an epoch")
        self.running = True
        self._shutdown = shutdown
        handler = self.spec.rdzv_handler
        stop_hearing = (
            handler.subscribe(self._on_rendezvous_event)
            if isinstance(handler, ElasticRendezvousHandler)
            else None
        )
        try:
            return await super().run(other, shutdown=shutdown, kill_now=kill_now)
        finally:
            self.running = False
            if stop_hearing is not None:
                stop_hearing()

    async def _stop(self, reason: str, signum: int, kill_now: anyio.Event) -> None:
        """A node stopped by a signal leaves the world cleanly: it logs its own loss before
        its workers stop, so the others make their smaller world at once instead of after a
        heartbeat timeout (and never take its workers' deaths for their own errors)."""
        if self._shutdown() is not None and self.live and not self._replaying:
            with anyio.move_on_after(LEAVE_NOTICE_TIMEOUT):
                await self._append_now(g.NodeLost(self.node, left=True))
        await super()._stop(reason, signum, kill_now)

    async def _append_now(self, event: g.Event) -> None:
        """Append ``event`` at once, past whatever is queued (the appender task may be gone)."""
        raw = g.encode_entry(g.LogEntry(event, self._token, self._serial))
        self._serial += 1
        index = max(self._next, self._append_at)
        while True:
            try:
                stored = await self._log.compare_set(str(index), b"", raw)
            except StoreError as exc:
                logger.info("could not log this node's leaving: %s", exc)
                return
            index += 1
            if stored == raw:
                self._append_at = index
                return

    def _on_rendezvous_event(self, event: RendezvousEvent) -> None:
        """The node that finds its ring successor's heartbeat gone logs it lost at once: the
        survivors' next generation need not wait for the next round (``last_call_timeout``)."""
        if isinstance(event, RendezvousNodeLost) and not self._replaying and self.live:
            with contextlib.suppress(anyio.ClosedResourceError):  # the attempt just ended
                self._record(g.NodeLost(event.lost), anyio.current_time())

    @asynccontextmanager
    async def _worlds_served(self) -> AsyncIterator[None]:
        scope = PrefixStore(f"aioelastic/inplace/{self.epoch}", self._job)
        self._log = PrefixStore("log", scope)
        with self._to_append, self._appends:
            worlds = TorchStoreListener(PrefixStore("worlds", scope), native=True)
            async with worlds as self._worlds_listener:
                await self._open_log()
                yield

    async def _open_log(self) -> None:
        """Begin the epoch's log, or read its beginning to replay it (joining)."""
        begin = self._plan.begin
        if begin is not None:
            stored = await self._log.compare_set("0", b"", g.encode_entry(g.LogEntry(begin)))
        else:
            stored = await self._log.get("0", timeout=self.spec.recovery_timeout)
        first = g.decode_entry(stored).event
        if not isinstance(first, g.Begin):
            raise g.GenerationLogError(stored, "the log of an epoch must begin with Begin")
        self.machine = g.GenerationMachine(
            first.nodes,
            recovery_timeout=self.spec.recovery_timeout,
            first_generation=first.first_generation,
        )
        self._next = self._append_at = 1
        if self._replaying:
            self.machine.start(anyio.current_time())  # replayed: the workers it names are gone
            spec = g.NodeSpec(self.spec.local_world_size, self.spec.spares)
            self._record(g.NodeLost(self.node), 0.0)  # an earlier life of this node, if any
            self._record(g.NodeJoined(self.node, spec), 0.0)

    def new_round(self, records: Sequence[NodeRecord], round_: int) -> tuple[Outcome, str] | None:
        """A later round completed while the epoch runs: nodes gone from it are lost (their
        workers leave the world, the survivors go on); an outcome if this node must leave."""
        plan = plan_epoch(self.node, records, round_)
        if plan.action != "stay":  # no failure of its workers: it costs no restart
            return Outcome.MEMBERSHIP, (
                f"this node's in-place epoch {self.epoch} is not the job's live one "
                f"({plan.epoch}); its workers stop and it joins that one"
            )
        if not self._replaying:
            for node in self.machine.nodes:
                if node not in plan.members:
                    self._record(g.NodeLost(node), anyio.current_time())
        return None

    # -- the log ----------------------------------------------------------------------------------

    def _start_workers(self, pumps: TaskGroup, watchers: TaskGroup) -> None:
        if self._began:
            super()._start_workers(pumps, watchers)
        else:  # a joining node's workers are started when its NodeJoined is read back
            self._pumps, self._watchers = pumps, watchers

    async def _wait_workers(self) -> tuple[Outcome, str]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow_log)
            tg.start_soon(self._append_each)
            ended = await super()._wait_workers()
            tg.cancel_scope.cancel()
        return ended

    def _record(self, event: g.Event, now: float, *, pid: int | None = None) -> list[g.Command]:
        self._to_append.send_nowait((event, pid))
        return []  # what it means comes back through the log, in the log's order

    async def _append_each(self) -> None:
        """Append what this node saw, in the order it saw it (compare-and-set on the next free
        index: an entry is whole or absent, whoever races for it)."""
        async for event, pid in self._appends:
            raw = g.encode_entry(g.LogEntry(event, self._token, self._serial, pid))
            self._serial += 1
            index = max(self._next, self._append_at)
            while True:
                try:
                    stored = await self._log.compare_set(str(index), b"", raw)
                except StoreError as exc:
                    logger.warning("generation log: appending failed (%s); trying again", exc)
                    await anyio.sleep(LOG_RETRY_PAUSE)
                    continue
                index += 1
                if stored == raw:
                    break
            self._append_at = index

    async def _follow_log(self) -> None:
        """Read the log in order, waiting on the store for each next entry."""
        while True:
            try:
                raw = await self._log.get(str(self._next), timeout=math.inf)
            except StoreError as exc:
                logger.warning("generation log: reading failed (%s); reading again", exc)
                await anyio.sleep(LOG_RETRY_PAUSE)
                continue
            self._next += 1
            try:
                entry = g.decode_entry(raw)
            except g.GenerationLogError as exc:  # every replica skips it alike
                logger.warning("generation log entry %d skipped: %s", self._next - 1, exc)
                continue
            self._tell.send_nowait(_Logged(entry))

    def _hear(self, notice: _Notice, now: float) -> list[g.Command]:
        if not isinstance(notice, _Logged):
            return super()._hear(notice, now)
        entry, event = notice.entry, notice.entry.event
        if isinstance(event, g.Begin):
            return []
        if isinstance(event, g.Ready) and entry.pid is not None:
            self._remote_pids[event.worker] = entry.pid
        try:
            commands = self.machine.send(event, now)
        except g.GenerationProtocolError as exc:  # every replica refuses it alike
            logger.warning("generation log entry refused: %s", exc)
            return []
        if isinstance(event, g.Ready):  # a spare of this node may be ready now: warm it
            self._warm_spares()
        if self._replaying:
            if entry.by == self._token and isinstance(event, g.NodeJoined):
                self._replaying = False  # caught up: from here on this replica acts
                return commands
            # The epoch ended before this node got in: end with it (nothing else to act on).
            return [c for c in commands if isinstance(c, g.FallBack | g.Finish)]
        return commands

    def _next_deadline(self) -> float:
        generation = self.machine.generation
        if self._replaying or generation is None or generation.number in self._timed_out:
            return math.inf
        return self.machine.deadline

    def _on_deadline(self, now: float) -> list[g.Command]:
        generation = self.machine.generation
        if generation is not None and now >= self._next_deadline():
            self._timed_out.add(generation.number)
            self._record(g.TimedOut(generation.number), now)
        return []

    def _pid_of(self, key: g.WorkerKey) -> int:
        return super()._pid_of(key) or self._remote_pids.get(key, 0)

    def _linked_pids(self) -> dict[g.WorkerKey, int]:
        return {**self._remote_pids, **super()._linked_pids()}

    def _world_store(self, generation: int) -> dict[str, Any]:
        listener = self._worlds_listener
        return {
            "kind": "tcp",
            "host": listener.host,
            "port": listener.port,
            "prefix": f"gen{generation}",
        }


class Attempts:
    """Makes each attempt's worker group: in-place recovery where asked for and possible.

    Generation numbers go on from one attempt to the next, so they strictly increase within
    the job even across a fallback to a restart.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.store: Store | None = None
        """The round's store: each in-place group shows its generation there."""
        self.last_generation = 0
        self.warm_modules: list[str] = []
        """What this node's workers had loaded by their first step (see
        :attr:`InPlaceGroup.warm_modules`): learned in one attempt, kept for the next."""
        self._current: InPlaceGroup | None = None
        self._warned = False
        self._heard: tuple[RendezvousInfo, tuple[NodeRecord, ...]] | None = None

    @property
    def node_id(self) -> int | None:
        """This node's id when its job recovers in place across nodes (an elastic rendezvous
        that allows more than one node), else None."""
        handler = self.spec.rdzv_handler
        if self.spec.recovery != "in-place" or not isinstance(handler, ElasticRendezvousHandler):
            return None
        return handler.node_id if handler.settings.max_nodes > 1 else None

    def record(self) -> NodeRecord | None:
        """What this node says of itself in the round being assigned (None: not across nodes)."""
        node = self.node_id
        if node is None:
            return None
        current = self._current
        epoch, last = 0, self.last_generation
        if isinstance(current, SharedInPlaceGroup) and current.live:
            epoch = current.epoch
            if current.machine.generation is not None:
                last = max(last, current.machine.generation.number)
        spec = g.NodeSpec(self.spec.local_world_size, self.spec.spares)
        return NodeRecord(node, spec, epoch, last)

    def heard(self, info: RendezvousInfo, records: Sequence[NodeRecord]) -> None:
        """Every node's record of round ``info`` (the agent exchanges them with the slots)."""
        self._heard = (info, tuple(records))

    def new_round(self) -> tuple[Outcome, str] | None:
        """Tell the running shared group of the round just heard; an outcome if it must end."""
        current = self._current
        assert isinstance(current, SharedInPlaceGroup)
        assert self._heard is not None
        info, records = self._heard
        current.show_in(info.store, info.rank)
        return current.new_round(records, info.round)

    def group(self, info: RoundInfo, ranks: list[WorkerRanks], **options: Any) -> WorkerGroup:
        """The group of the attempt ``info`` (``options`` as :class:`WorkerGroup` takes them)."""
        self._note_last()
        if self.spec.recovery != "in-place":
            return WorkerGroup(self.spec, info, ranks, **options)
        node, heard = self.node_id, self._heard
        job = None if heard is None else job_store(heard[0])
        if node is not None and heard is not None and job is not None:
            shared = SharedInPlaceGroup(
                self.spec,
                info,
                ranks,
                job=job,
                node=node,
                records=heard[1],
                round_=heard[0].round,
                **options,
            )
            shared.store = self.store
            shared.warm_modules = self.warm_modules
            self._current = shared
            return shared
        if info.group_world_size > 1:
            if not self._warned:
                logger.warning(
                    "--recovery in-place recovers a job over %d nodes only with an elastic "
                    "rendezvous (c10d, etcd); here a failure restarts the group as --recovery "
                    "restart does",
                    info.group_world_size,
                )
                self._warned = True
            return WorkerGroup(self.spec, info, ranks, **options)
        group = InPlaceGroup(self.spec, info, ranks, **options)
        group.first_generation = self.last_generation + 1
        group.store = self.store
        group.warm_modules = self.warm_modules
        self._current = group
        return group

    def _note_last(self) -> None:
        current, self._current = self._current, None
        machine = getattr(current, "machine", None)  # a shared group that never opened has none
        if machine is not None and machine.generation is not None:
            self.last_generation = machine.generation.number
