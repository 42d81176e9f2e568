"""The shell of in-place recovery on one node: processes and links in, generations out.

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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioelastic.agent import _generations as g
from aioelastic.agent._env import RoundInfo, WorkerRanks
from aioelastic.agent._events import (
    AgentEvent,
    GenerationAssigned,
    GenerationFormed,
    RecoveryFellBack,
    ReplacedWorker,
    SpareStarted,
    WorkerEvicted,
    WorkerFailed,
    WorkersStarted,
    WorkerSucceeded,
)
from aioelastic.agent._group import Outcome, WorkerGroup, _Worker
from aioelastic.agent._spec import WorkerSpec
from aioelastic.store import Store, StoreError, TCPStoreServer
from aioelastic.worker._protocol import (
    WORKER_FD_ENV,
    Enter,
    Hello,
    LineDecoder,
    LinkProtocolError,
    Message,
    NoMoreWorlds,
    StillValid,
    Trouble,
    WorldAssigned,
    WorldEnded,
    encode,
)

logger = logging.getLogger(__name__)


def encode_generation(machine: g.GenerationMachine, pids: Mapping[g.WorkerKey, int]) -> bytes:
    """What ``aioelastic status`` reads: the generation, its pids by rank, the spares' pids."""
    generation = machine.generation
    spares = [pids[key] for key in machine.spares()]
    return json.dumps(
        {
            "generation": 0 if generation is None else generation.number,
            "phase": machine.phase.name.lower(),
            "pids": [] if generation is None else [pids[k] for k in generation.members],
            "spares": spares,
        }
    ).encode()


VERDICT_GRACE = 2.0
"""How long a worker whose ``with world:`` raised waits to hear that its world ended before the
exception counts as its own (a peer's death reaches the agent through its pidfd within
milliseconds; a collective's error can come first)."""


@dataclass(frozen=True, slots=True)
class _Exit:
    key: g.WorkerKey


@dataclass(frozen=True, slots=True)
class _Said:
    key: g.WorkerKey
    message: Message


_Notice = _Exit | _Said


@dataclass(slots=True)
class _Linked:
    key: g.WorkerKey
    worker: _Worker
    link: socket.socket


class InPlaceGroup(WorkerGroup):
    """This node's workers under in-place recovery (see the module docstring)."""

    first_generation = 1
    """The number of this attempt's first generation (numbers go on across attempts)."""
    store: Store | None = None
    """Where the node's generation is shown (``aioelastic status``), if anywhere."""

    def _setup(self) -> None:
        node = self.info.group_rank
        self.machine = g.GenerationMachine(
            {node: g.NodeSpec(self.spec.local_world_size, self.spec.spares)},
            recovery_timeout=self.spec.recovery_timeout,
            first_generation=self.first_generation,
        )
        self._linked: dict[g.WorkerKey, _Linked] = {}
        self._verdicts: dict[g.WorkerKey, tuple[int, float]] = {}
        self._failed_at: dict[g.WorkerKey, float] = {}
        self._tell, self._heard = anyio.create_memory_object_stream[_Notice](math.inf)
        self._reports: list[AgentEvent] = []
        self._troubled: dict[int, set[g.WorkerKey]] = {}
        self._condemned: dict[int, set[g.WorkerKey]] = {}
        """By generation: the members told their error is their own (they are failing)."""
        self._asked_at: dict[g.WorkerKey, float] = {}
        self._later: list[g.Spawn] = []
        self._shown = anyio.Event()

    async def run(
        self,
        other: Callable[[], Awaitable[tuple[Outcome, str]]],
        *,
        shutdown: Callable[[], int | None],
        kill_now: anyio.Event,
    ) -> tuple[Outcome, str]:
        self._setup()
        try:
            async with TCPStoreServer("127.0.0.1", 0) as self._worlds_store:
                with self._tell, self._heard:
                    return await super().run(other, shutdown=shutdown, kill_now=kill_now)
        finally:
            for linked in self._linked.values():
                linked.link.close()

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
            if self.store is not None:
                tg.start_soon(self._show_generation, self.store)
            ended = await self._drive()
            tg.cancel_scope.cancel()
        return ended

    async def _show_generation(self, store: Store) -> None:
        """Keep this node's generation and spares in ``store`` (``aioelastic status`` reads it)."""
        shown = b""
        while True:
            await self._shown.wait()
            self._shown = anyio.Event()
            value = encode_generation(self.machine, self._linked_pids())
            if value != shown:
                try:
                    await store.set(g.generation_key(self.info.group_rank), value)
                    shown = value
                except StoreError as exc:  # the status display is not worth failing a job
                    logger.info("could not show generation in the store: %s", exc)

    def _linked_pids(self) -> dict[g.WorkerKey, int]:
        return {key: linked.worker.process.pid for key, linked in self._linked.items()}

    async def _drive(self) -> tuple[Outcome, str]:
        heard: MemoryObjectReceiveStream[_Notice] = self._heard
        while True:
            due = min([self.machine.deadline, *(d for _, d in self._verdicts.values())])
            notice: _Notice | None = None
            with anyio.move_on_after(max(0.0, due - anyio.current_time())):
                notice = await heard.receive()
            now = anyio.current_time()
            if notice is None:
                self._give_verdicts(now)
                commands = self.machine.send(g.Tick(), now)
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
        linked = self._linked[notice.key]
        if isinstance(notice, _Exit):
            return self._exited(linked, now)
        match notice.message:
            case Hello():
                return self.machine.send(g.Ready(linked.key), now)
            case Enter(generation=number):
                return self.machine.send(g.Entered(linked.key, number), now)
            case Trouble(generation=number):
                current = self.machine.generation
                if current is not None and current.number == number:
                    self._verdicts[linked.key] = (number, now + VERDICT_GRACE)
                    self._asked_at[linked.key] = now
                    self._troubled.setdefault(number, set()).add(linked.key)
                return []
            case other:
                logger.warning("worker %s sent an agent's message %r; ignored", linked.key, other)
                return []

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
        return self.machine.send(g.Exited(linked.key, code), now)

    def _give_verdicts(self, now: float) -> None:
        """Answer the workers whose grace passed: wait on while a peer told "still valid" is
        failing (its exit breaks the others' collectives before the agent sees it), evict the
        likely hung peers (their deaths end the world, which answers everyone), or tell them
        their world is still valid (the error is their own)."""
        current = self.machine.generation
        for key, (number, due) in list(self._verdicts.items()):
            if due > now or key not in self._verdicts:
                continue
            del self._verdicts[key]
            if current is None or current.number != number:
                continue
            alive = [k for k in current.members if self.machine.state_of(k) is g.WorkerState.MEMBER]
            failing = self._condemned.setdefault(number, set())
            waited = now - self._asked_at.get(key, now)
            if (failing & set(alive)) - {key} and waited < self.spec.recovery_timeout:
                self._verdicts[key] = (number, now + VERDICT_GRACE)
                continue
            evict = g.suspects(alive, self._troubled.get(number, set()) - failing)
            if not evict:
                failing.add(key)
                self._send(key, StillValid(number))
                continue
            for other in [k for k, (n, _) in self._verdicts.items() if n == number]:
                del self._verdicts[other]
            troubled = len(self._troubled[number])
            for suspect in evict:
                worker = self._linked[suspect].worker
                reason = (
                    f"{troubled} of {len(alive)} ranks' collectives failed in generation "
                    f"{number} while it answered nothing: taken for hung"
                )
                self._emit(
                    WorkerEvicted(
                        worker.ranks.rank, worker.ranks.local_rank, worker.process.pid, reason
                    )
                )
                worker.process.signal_group(signal.SIGKILL)

    # -- from the machine to the world ------------------------------------------------------------

    def _apply(self, commands: list[g.Command]) -> tuple[Outcome, str] | None:
        """Do what the machine said: tell the workers first, then start processes, then
        report. A new spare starts once the generation formed: starting a process holds this
        loop, which also serves the world's store, for tens of milliseconds on a busy host."""
        urgent = [c for c in commands if isinstance(c, g.Assign | g.EndWorld | g.Stop)]
        spawns = [c for c in commands if isinstance(c, g.Spawn)]
        rest = [c for c in commands if not isinstance(c, g.Assign | g.EndWorld | g.Stop | g.Spawn)]
        for command in [*urgent, *spawns, *rest]:
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
                    self._send(command.worker, self._world_message(place))
                case g.EndWorld():
                    for key in command.workers:
                        self._verdicts.pop(key, None)
                        self._send(key, WorldEnded(command.generation, command.reason))
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
                case g.FallBack():
                    self._emit(RecoveryFellBack(command.reason))
                    return Outcome.FAILED, f"in-place recovery fell back: {command.reason}"
                case g.Finish():
                    return Outcome.SUCCEEDED, "all workers succeeded"
        return None

    def _world_message(self, place: g.Place) -> WorldAssigned:
        return WorldAssigned(
            **dataclasses.asdict(place),
            store={
                "kind": "tcp",
                "host": self._worlds_store.host,
                "port": self._worlds_store.port,
                "prefix": f"aioelastic/{self.info.restart_count}/gen{place.generation}",
            },
            timeout=self.spec.recovery_timeout / 2,
        )

    def _pids(self, generation: g.Generation) -> tuple[int, ...]:
        return tuple(self._linked[key].worker.process.pid for key in generation.members)

    def _replaced(self, replacements: tuple[g.Replacement, ...]) -> tuple[ReplacedWorker, ...]:
        return tuple(
            ReplacedWorker(
                rank=r.rank,
                local_rank=r.slot,
                failed_pid=None
                if r.replaced is None
                else self._linked[r.replaced].worker.process.pid,
                pid=self._linked[r.by].worker.process.pid,
                by_spare=r.spare,
            )
            for r in replacements
        )

    def _send(self, key: g.WorkerKey, message: Message) -> None:
        """Tell a worker something; a worker that is gone will be heard of through its pidfd."""
        try:
            self._linked[key].link.send(encode(message))
        except (BlockingIOError, OSError) as exc:
            logger.info("could not tell worker %s %s: %s", key, type(message).__name__, exc)

    # -- processes and links --------------------------------------------------------------------

    def _ranks_for(self, slot: int | None) -> WorkerRanks:
        """The environment's ranks of ``slot`` (a spare is started with slot 0's)."""
        return self.ranks[slot or 0]

    def _spawn_linked(self, key: g.WorkerKey, slot: int | None) -> None:
        ours, theirs = socket.socketpair()
        try:
            worker = self._spawn(
                self._ranks_for(slot),
                self._pumps,
                tag=f"{slot if slot is not None else 'spare'}.{key.serial}",
                extra_env={WORKER_FD_ENV: str(theirs.fileno()), "AIOELASTIC_RECOVERY": "in-place"},
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.workers.append(worker)
        self._linked[key] = _Linked(key, worker, ours)
        self._watchers.start_soon(self._watch_linked, key)
        scope = anyio.CancelScope(shield=True)  # bounded by the drain deadline, like the pumps
        self._pump_scopes.append(scope)
        self._pumps.start_soon(self._read_link, key, scope)
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
        link, decoder = self._linked[key].link, LineDecoder()
        with scope:
            while True:
                await anyio.wait_readable(link)
                try:
                    data = link.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    return  # the worker (and whatever inherited its end) exited
                try:
                    messages = decoder.feed(data)
                except LinkProtocolError as exc:
                    logger.warning("worker %s: %s; its link is ignored from now on", key, exc)
                    return
                for message in messages:
                    self._tell.send_nowait(_Said(key, message))


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
        self._current: InPlaceGroup | None = None
        self._warned = False

    def group(self, info: RoundInfo, ranks: list[WorkerRanks], **options: Any) -> WorkerGroup:
        """The group of the attempt ``info`` (``options`` as :class:`WorkerGroup` takes them)."""
        self._note_last()
        if self.spec.recovery != "in-place":
            return WorkerGroup(self.spec, info, ranks, **options)
        if info.group_world_size > 1:
            if not self._warned:
                logger.warning(
                    "--recovery in-place recovers a single node's job so far; with %d nodes a "
                    "failure restarts the group as --recovery restart does",
                    info.group_world_size,
                )
                self._warned = True
            return WorkerGroup(self.spec, info, ranks, **options)
        group = InPlaceGroup(self.spec, info, ranks, **options)
        group.first_generation = self.last_generation + 1
        group.store = self.store
        self._current = group
        return group

    def _note_last(self) -> None:
        current, self._current = self._current, None
        if current is not None and current.machine.generation is not None:
            self.last_generation = current.machine.generation.number
