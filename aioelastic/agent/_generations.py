"""Generations of a job's world: the in-place recovery protocol as a pure state machine.

Theory of operation. Besides rendezvous *rounds* between agents, a job has *generations* of its
workers' world, numbered 1, 2, ... and never reused. A generation is a list of workers in rank
order (ranks are dense, 0..N-1), each holding one *slot* (its local rank) on its node. The
:class:`GenerationMachine` is the single source of truth about them; it does no I/O and reads
no clock (every call takes ``now``). The shell feeds it what happened (:data:`Event`) and does
what it returns (:data:`Command`): start a process, tell a worker its place or that its world
ended, stop a worker, report.

* **Waiting.** The first workers (one per slot) and the spares are started together. Each worker
  that calls ``worker.worlds()`` says it is :class:`Ready`. Once every slot's worker is ready,
  generation 1 is assigned with the ranks the environment already gave them. A worker that
  never asks for a world keeps today's behaviour: the job succeeds when every worker exits 0,
  and any failure before generation 1 was assigned falls back to a full restart (nobody knows
  whether the others would survive it).
* **Forming -> running.** Every member of an assigned generation says it :class:`Entered` the
  world (``with world:``); when all have, the generation is *formed* and the time since the
  failure that caused it is reported. A generation that does not form within
  ``recovery_timeout`` falls back to a full restart, naming who it waited for: a ladder, never a
  hang.
* **A failure.** A member that fails (while forming or running) ends its generation: every
  other assigned member is told, and the next generation is assigned at once. Survivors keep
  their slots and, where it is below the new world size, their rank. A failed slot goes to a
  spare on the same node when there is one (a ready one first, else one still starting; then
  a new spare is started in the background), else to a new process; fresh members are
  assigned as soon as they are ready.
  Failures while a generation forms simply make the next one (two failures at once: two
  generations in a row, or one, depending on order; never a rank held twice).
* **Membership.** A lost node (its agent died, or the rendezvous lost it) removes its workers
  and makes a smaller generation. A joining node's workers are started and join the *next*
  generation once all of them are ready; the running generation is not disturbed meanwhile.
  A node joining before generation 1 was assigned is simply one of generation 1's.
* **Verdicts.** A member whose ``with world:`` raised while its world seemed valid asks
  whether the world ended (:class:`Troubled`); its agent reports when it waited long enough
  (:class:`VerdictDue`). If by then most members asked while the others said nothing, the
  silent ones are taken for hung and taken out (:class:`Evict`: on gloo a hung peer gives the
  others no error but their process group's timeout); else, at the final verdict, the error is
  the asker's own (:class:`OwnError`: it fails, as without the API). Every replica of a job
  over many nodes decides alike, from the log's order alone. An early :class:`VerdictDue`
  (``final=False``) only evicts: across nodes the final one waits for a lost node to be known.
* **Leaving.** A survivor told that its world ended must enter the next one; one blocked in a
  collective with a peer that never answers (on a lost node) is made to leave by an abort in
  its own process (see ``aioelastic/worker/_abort.py``). The shell reports a survivor that has
  not entered a later generation in time (:class:`LeaveDue`: it did not leave, or it cannot
  abort); the machine then takes it out like a failed member (:class:`Evict`: the shell kills
  it, a spare or a new process takes its slot).
* **A storm.** More than ``max_failures`` member failures in one attempt fall back too, so a
  failure that every fresh rank meets again ends in the restart budget, not in a loop.
* **The end.** Every member of the running generation exiting 0 finishes the job (spares are
  stopped). A member exiting 0 while another fails, or while a generation forms, falls back.

Who holds state: the members of the last *formed* generation. A member of a new generation that
does not is *fresh*; ``source_rank`` is the lowest rank that is not. Before any generation has
formed nobody holds state, so nobody is fresh. :data:`TRANSITIONS` lists, for each phase, the
events it accepts and the phases they may lead to; anything else is a
:class:`GenerationProtocolError` naming the event and the phase.
"""

from __future__ import annotations

import enum
import json
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from aioelastic._kinds.agent import EvictCause as EvictCause

GENERATION_PREFIX = "aioelastic/agent/generation/"
"""In a round's store, where each node shows its generation (``aioelastic status`` reads it)."""


def generation_key(group_rank: int) -> str:
    """Where the node of ``group_rank`` shows its generation."""
    return f"{GENERATION_PREFIX}{group_rank}"


# -- identities and records -----------------------------------------------------------------------


@dataclass(frozen=True, order=True, slots=True)
class WorkerKey:
    """One worker process of the job: its node and a serial number unique on that node."""

    node: int
    serial: int

    def __str__(self) -> str:
        return f"{self.node}.{self.serial}"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """What one node contributes: workers (slots) and warm spares."""

    local_world_size: int
    spares: int = 0


@dataclass(frozen=True, slots=True)
class Place:
    """A worker's place in one generation (what ``worker.worlds()`` yields, less the store)."""

    generation: int
    rank: int
    world_size: int
    local_rank: int
    is_fresh: bool
    source_rank: int
    fresh_ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Generation:
    """An assigned generation: members in rank order and why it was made.

    Lookups are O(1): the ranks, the fresh ranks and the source rank are worked out once.
    """

    number: int
    members: tuple[WorkerKey, ...]
    slots: tuple[int, ...]
    fresh: frozenset[WorkerKey]
    reason: str
    _ranks: Mapping[WorkerKey, int] = field(init=False, repr=False, compare=False)
    _fresh_ranks: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _source_rank: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranks = {key: rank for rank, key in enumerate(self.members)}
        fresh = tuple(rank for rank, key in enumerate(self.members) if key in self.fresh)
        source = next((r for r, k in enumerate(self.members) if k not in self.fresh), 0)
        object.__setattr__(self, "_ranks", ranks)
        object.__setattr__(self, "_fresh_ranks", fresh)
        object.__setattr__(self, "_source_rank", source)

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def fresh_ranks(self) -> tuple[int, ...]:
        return self._fresh_ranks

    @property
    def source_rank(self) -> int:
        return self._source_rank

    def __contains__(self, key: object) -> bool:
        return key in self._ranks

    def rank_of(self, key: WorkerKey) -> int:
        """``key``'s rank (KeyError: not a member)."""
        return self._ranks[key]

    def place_of(self, key: WorkerKey) -> Place:
        rank = self._ranks[key]
        return Place(
            generation=self.number,
            rank=rank,
            world_size=self.world_size,
            local_rank=self.slots[rank],
            is_fresh=key in self.fresh,
            source_rank=self._source_rank,
            fresh_ranks=self._fresh_ranks,
        )


class Phase(enum.Enum):
    """Where the job's world is."""

    WAITING = "waiting for the first workers to ask for a world"
    FORMING = "a generation is assigned; waiting for its members to enter it"
    RUNNING = "the generation formed; training"
    FINISHED = "every member succeeded"
    FELL_BACK = "in-place recovery gave up: a full restart is needed"


# -- events (inputs) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker asked for a world (``worker.worlds()``): it is waiting for a place."""

    worker: WorkerKey


@dataclass(frozen=True, slots=True)
class Entered:
    """A worker entered generation ``generation`` (``with world:``)."""

    worker: WorkerKey
    generation: int


@dataclass(frozen=True, slots=True)
class Exited:
    """A worker's process ended (a watchdog reap is an exit by signal)."""

    worker: WorkerKey
    returncode: int


@dataclass(frozen=True, slots=True)
class NodeLost:
    """A node is gone with all its workers (its agent died, or the rendezvous lost it)."""

    node: int
    left: bool = False
    """Its agent said so itself as it stopped (a clean leave: no heartbeat to wait out)."""


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """A node joined the job; its workers are to be started."""

    node: int
    spec: NodeSpec


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: deadlines up to ``now`` are due."""


@dataclass(frozen=True, slots=True)
class TimedOut:
    """Generation ``generation``'s deadline passed (the replicated form of :class:`Tick`: every
    replica of a job's machine decides the same, whatever its clock says)."""

    generation: int


LEAVE_CAUSES = (EvictCause.DID_NOT_LEAVE, EvictCause.ABORT_UNAVAILABLE)
"""What a :class:`LeaveDue` may say (a hung member is the machine's own verdict)."""


@dataclass(frozen=True, slots=True)
class LeaveDue:
    """``worker``, told that ``generation`` ended, has had its time to enter a later one."""

    worker: WorkerKey
    generation: int
    cause: EvictCause
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Troubled:
    """An exception left ``worker``'s ``with world:`` of ``generation``; it asks whether that
    world ended (a peer's failure breaking a collective) or the error is its own."""

    worker: WorkerKey
    generation: int


@dataclass(frozen=True, slots=True)
class VerdictDue:
    """``worker``'s agent waited long enough for ``generation``'s end: decide (``final``), or
    only look for hung peers (an early look)."""

    worker: WorkerKey
    generation: int
    final: bool


Event = (
    Ready
    | Entered
    | Exited
    | NodeLost
    | NodeJoined
    | Tick
    | TimedOut
    | LeaveDue
    | Troubled
    | VerdictDue
)
EVENT_TYPES: tuple[type, ...] = (
    Ready,
    Entered,
    Exited,
    NodeLost,
    NodeJoined,
    Tick,
    TimedOut,
    LeaveDue,
    Troubled,
    VerdictDue,
)

# -- commands (outputs) -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a worker process on ``worker.node``; ``slot`` is its local rank (None: a spare)."""

    worker: WorkerKey
    slot: int | None


@dataclass(frozen=True, slots=True)
class Assign:
    """Tell a ready worker its place in a generation."""

    worker: WorkerKey
    place: Place


@dataclass(frozen=True, slots=True)
class EndWorld:
    """Tell these workers that ``generation`` ended (``world.check()`` raises from now on)."""

    generation: int
    workers: tuple[WorkerKey, ...]
    reason: str
    abort: bool = False
    """A member is gone: a collective with it never completes, so abort the survivors' (a
    joining node ends a world whose collectives all complete: no abort)."""


@dataclass(frozen=True, slots=True)
class Evict:
    """Kill ``worker``, a member that still runs: the machine took it out of the world."""

    worker: WorkerKey
    generation: int
    """The generation it was in when taken out."""
    cause: EvictCause
    reason: str


@dataclass(frozen=True, slots=True)
class OwnError:
    """Tell ``worker`` that ``generation`` did not end: the exception it asked about is its own
    (it fails, as it would without the API)."""

    worker: WorkerKey
    generation: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop a worker that has no place any more (a spare at the end)."""

    worker: WorkerKey


@dataclass(frozen=True, slots=True)
class Replacement:
    """Who took a failed or lost member's slot."""

    rank: int
    node: int
    slot: int
    replaced: WorkerKey | None
    """The worker that held the slot (None: a slot new to the world)."""
    by: WorkerKey
    spare: bool
    """Whether a warm spare took it (else a new process)."""


@dataclass(frozen=True, slots=True)
class GenerationAssigned:
    """A generation was assigned (report): why, and who was replaced by whom."""

    generation: Generation
    replacements: tuple[Replacement, ...]


@dataclass(frozen=True, slots=True)
class GenerationFormed:
    """Every member entered the generation (report); ``since_failure`` in seconds, if any."""

    generation: Generation
    replacements: tuple[Replacement, ...]
    since_failure: float | None


@dataclass(frozen=True, slots=True)
class NodeOut:
    """The job took ``node`` for lost while its agent may still run (it missed a round, or a
    heartbeat): that agent stops its workers, whose places are given away, and joins again."""

    node: int
    reason: str


@dataclass(frozen=True, slots=True)
class FallBack:
    """In-place recovery gave up; the shell restarts the group as without it."""

    reason: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Every member of the running generation succeeded: the job is done here."""


Command = (
    Spawn
    | Assign
    | EndWorld
    | Evict
    | OwnError
    | Stop
    | GenerationAssigned
    | GenerationFormed
    | NodeOut
    | FallBack
    | Finish
)


class GenerationProtocolError(Exception):
    """An event arrived that the generation protocol does not accept in its phase."""

    def __init__(self, event: Event, phase: Phase, why: str) -> None:
        super().__init__(f"{type(event).__name__} {event} in phase {phase.name}: {why}")


TERMINAL_PHASES = (Phase.FINISHED, Phase.FELL_BACK)
"""Phases a machine never leaves."""
_TERMINAL = TERMINAL_PHASES
TRANSITIONS: Mapping[Phase, Mapping[type, frozenset[Phase]]] = {
    Phase.WAITING: {
        Ready: frozenset({Phase.WAITING, Phase.FORMING, Phase.FELL_BACK}),
        Exited: frozenset({Phase.WAITING, Phase.FINISHED, Phase.FELL_BACK}),
        Entered: frozenset({Phase.WAITING}),
        NodeLost: frozenset({Phase.WAITING, Phase.FELL_BACK}),
        NodeJoined: frozenset({Phase.WAITING}),
        Tick: frozenset({Phase.WAITING}),
        TimedOut: frozenset({Phase.WAITING}),
        LeaveDue: frozenset({Phase.WAITING}),
        Troubled: frozenset({Phase.WAITING}),
        VerdictDue: frozenset({Phase.WAITING}),
    },
    Phase.FORMING: {
        Ready: frozenset({Phase.FORMING}),
        Entered: frozenset({Phase.FORMING, Phase.RUNNING}),
        Exited: frozenset({Phase.FORMING, Phase.FELL_BACK}),
        NodeLost: frozenset({Phase.FORMING, Phase.FELL_BACK}),
        NodeJoined: frozenset({Phase.FORMING}),
        Tick: frozenset({Phase.FORMING, Phase.FELL_BACK}),
        TimedOut: frozenset({Phase.FORMING, Phase.FELL_BACK}),
        LeaveDue: frozenset({Phase.FORMING, Phase.FELL_BACK}),
        Troubled: frozenset({Phase.FORMING}),
        VerdictDue: frozenset({Phase.FORMING, Phase.FELL_BACK}),
    },
    Phase.RUNNING: {
        Ready: frozenset({Phase.RUNNING, Phase.FORMING}),
        Entered: frozenset({Phase.RUNNING}),
        Exited: frozenset({Phase.RUNNING, Phase.FORMING, Phase.FINISHED, Phase.FELL_BACK}),
        NodeLost: frozenset({Phase.FORMING, Phase.FELL_BACK, Phase.RUNNING}),
        NodeJoined: frozenset({Phase.RUNNING}),
        Tick: frozenset({Phase.RUNNING}),
        TimedOut: frozenset({Phase.RUNNING}),
        LeaveDue: frozenset({Phase.RUNNING}),
        Troubled: frozenset({Phase.RUNNING}),
        VerdictDue: frozenset({Phase.RUNNING, Phase.FORMING, Phase.FELL_BACK}),
    },
    # Terminal: the shell may still report exits of what it stops; nothing changes any more.
    Phase.FINISHED: {kind: frozenset({Phase.FINISHED}) for kind in EVENT_TYPES},
    Phase.FELL_BACK: {kind: frozenset({Phase.FELL_BACK}) for kind in EVENT_TYPES},
}


MAX_FAILURES = 10
"""Member failures one machine (one attempt) replaces in place before it falls back to a
restart: a failure that repeats (a bug every fresh rank meets) must end in the restart budget,
not loop forever."""

_MIXED = (
    "some workers asked for a world (aioelastic.worker) and others exited without asking: "
    "with --recovery in-place, every worker of the job uses aioelastic.worker or none does"
)


class WorkerState(enum.Enum):
    STARTING = "started, not yet asking for a world"
    READY = "asking for a world"
    MEMBER = "holds a place in the current generation"
    DONE = "exited 0"
    GONE = "failed, lost or stopped"


@dataclass(slots=True)
class _Worker:
    key: WorkerKey
    slot: int | None
    """The local rank it was started for; None for a spare (until it takes a slot)."""
    state: WorkerState = WorkerState.STARTING
    joiner: bool = False
    """Started for a node that joined; waits for the next generation."""
    entered: int = 0
    """The newest generation it entered (0: none)."""


@dataclass(slots=True)
class _Node:
    spec: NodeSpec
    serial: int = 0
    in_world: bool = True


@dataclass(slots=True)
class _Recovery:
    """The recovery in progress: when it started, and the deadline of the forming generation."""

    failed_at: float | None
    deadline: float
    replacements: tuple[Replacement, ...] = ()
    entered: set[WorkerKey] = field(default_factory=set)


class GenerationMachine:
    """The generations of one job's world (see the module docstring)."""

    def __init__(
        self,
        nodes: Mapping[int, NodeSpec],
        *,
        recovery_timeout: float,
        first_generation: int = 1,
        max_failures: int = MAX_FAILURES,
    ) -> None:
        if not nodes:
            raise ValueError("a job's world needs at least one node")
        if not recovery_timeout > 0:
            raise ValueError(f"recovery_timeout must be > 0 seconds, got {recovery_timeout!r}")
        if first_generation < 1:
            raise ValueError(f"generations count from 1, got {first_generation!r}")
        self.recovery_timeout = recovery_timeout
        self.first_generation = first_generation
        self.max_failures = max_failures
        self.failures = 0
        """Member failures replaced in place so far."""
        self.phase = Phase.WAITING
        self.generation: Generation | None = None
        self._nodes = {node: _Node(spec) for node, spec in sorted(nodes.items())}
        self._workers: dict[WorkerKey, _Worker] = {}
        self._holds_state: frozenset[WorkerKey] = frozenset()
        self._formed_once = False
        self._recovery: _Recovery | None = None
        self._started = False
        self._first: Counter[WorkerState] = Counter()
        """The first workers' states while WAITING (kept as counts: O(1) per event)."""
        self._done_members = 0
        """Members of the current generation that exited 0."""
        self._troubled: set[WorkerKey] = set()
        """Members of the current generation that asked whether it ended."""
        self._condemned: set[WorkerKey] = set()
        """Members of the current generation told that their error is their own."""
        self.fallback_reason: str | None = None

    # -- queries --------------------------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """When the shell must send :class:`Tick` at the latest (inf: no deadline)."""
        return self._recovery.deadline if self._recovery is not None else math.inf

    @property
    def nodes(self) -> tuple[int, ...]:
        """The nodes in the job (admitted or joining), in order."""
        return tuple(self._nodes)

    def state_of(self, key: WorkerKey) -> WorkerState:
        return self._workers[key].state

    def spares(self, node: int | None = None) -> tuple[WorkerKey, ...]:
        """Ready spares (on ``node``, or anywhere), oldest first."""
        return tuple(
            w.key
            for w in self._workers.values()
            if w.slot is None
            and w.state is WorkerState.READY
            and (node is None or w.key.node == node)
        )

    def holders(self, node: int) -> dict[int, WorkerKey]:
        """Who holds each slot (local rank) of ``node`` now: the current generation's members
        there, else the workers started for a slot. A spare that never took a slot holds none;
        a replaced worker no longer holds its slot."""
        generation = self.generation
        if generation is not None:
            return {
                generation.slots[rank]: key
                for rank, key in enumerate(generation.members)
                if key.node == node
            }
        return {
            w.slot: w.key
            for w in self._workers.values()
            if w.slot is not None and w.key.node == node
        }

    def alive(self) -> tuple[WorkerKey, ...]:
        """Every worker that still runs, as far as the machine knows."""
        return tuple(
            k
            for k, w in self._workers.items()
            if w.state not in (WorkerState.DONE, WorkerState.GONE)
        )

    # -- driving ----------------------------------------------------------------------------------

    def start(self, now: float) -> list[Command]:
        """The first workers of every node (slot order) and the spares."""
        if self._started:
            raise RuntimeError("start() runs once")
        self._started = True
        commands: list[Command] = []
        for node, state in self._nodes.items():
            commands += self._spawn_node(node, state, joiner=False)
        self._first[WorkerState.STARTING] = sum(
            1 for w in self._workers.values() if w.slot is not None
        )
        return commands

    def send(self, event: Event, now: float) -> list[Command]:
        """Feed one event; return what the shell must do, in order."""
        allowed = TRANSITIONS[self.phase]
        if type(event) not in allowed:
            raise GenerationProtocolError(event, self.phase, "not accepted here")
        before = self.phase
        if before in _TERMINAL:
            return []
        commands = self._handle(event, now)
        if self.phase not in allowed[type(event)]:
            raise AssertionError(f"{type(event).__name__} moved {before.name} to {self.phase.name}")
        return commands

    # -- handlers ---------------------------------------------------------------------------------

    def _handle(self, event: Event, now: float) -> list[Command]:
        match event:
            case Ready():
                return self._ready(self._known(event, event.worker), now)
            case Entered():
                return self._entered(self._known(event, event.worker), event.generation, now)
            case Exited():
                return self._exited(self._known(event, event.worker), event.returncode, now)
            case NodeLost():
                return self._node_lost(event.node, now, left=event.left)
            case NodeJoined():
                return self._node_joined(event, now)
            case Tick():
                if now >= self.deadline:
                    return self._fall_back(self._why_not_formed())
                return []
            case LeaveDue():
                return self._leave_due(self._known(event, event.worker), event, now)
            case Troubled():
                worker = self._known(event, event.worker)
                if self._asks_of_current(worker, event.generation):
                    self._troubled.add(worker.key)
                return []
            case VerdictDue():
                return self._verdict(self._known(event, event.worker), event, now)
            case TimedOut(generation=number):
                current = self.generation
                if self.phase is Phase.FORMING and current is not None and current.number == number:
                    return self._fall_back(self._why_not_formed())
                return []  # that generation formed or ended meanwhile
        raise AssertionError(event)  # pragma: no cover

    def _known(self, event: Event, key: WorkerKey) -> _Worker:
        worker = self._workers.get(key)
        if worker is None:
            raise GenerationProtocolError(event, self.phase, f"worker {key} was never started")
        return worker

    def _ready(self, worker: _Worker, now: float) -> list[Command]:
        if worker.state is not WorkerState.STARTING:
            return []  # a worker asks once per process; a repeat (or a late one) changes nothing
        worker.state = WorkerState.READY
        generation = self.generation
        if self.phase is Phase.WAITING:
            if worker.slot is None:
                return []
            self._first[WorkerState.STARTING] -= 1
            self._first[WorkerState.READY] += 1
            if self._first[WorkerState.DONE]:
                return self._fall_back(_MIXED)
            if not self._first[WorkerState.STARTING]:
                return self._assign(now, "the job started", failed_at=None, first=True)
            return []
        if generation is not None and worker.key in generation:
            worker.state = WorkerState.MEMBER  # a replacement that was started for its place
            return [Assign(worker.key, generation.place_of(worker.key))]
        if worker.joiner:
            node = worker.key.node
            ready = all(
                w.state is WorkerState.READY
                for w in self._workers.values()
                if w.key.node == node and w.joiner and w.slot is not None
            )
            if ready and self.phase is Phase.RUNNING and not self._finishing():
                return self._next_generation(now, f"node {node} joined", failed_at=None)
        return []

    def _entered(self, worker: _Worker, number: int, now: float) -> list[Command]:
        generation, recovery = self.generation, self._recovery
        if generation is None or number != generation.number or recovery is None:
            return []  # a generation that already ended, or a repeat
        if worker.key not in generation:
            return []
        worker.entered = max(worker.entered, number)
        recovery.entered.add(worker.key)
        if self.phase is Phase.FORMING and len(recovery.entered) == generation.world_size:
            self.phase = Phase.RUNNING
            self._recovery = None
            self._formed_once = True
            self._holds_state = frozenset(generation.members)
            since = None if recovery.failed_at is None else now - recovery.failed_at
            commands: list[Command] = [GenerationFormed(generation, recovery.replacements, since)]
            return commands + self._admit_ready_joiners(now)
        return []

    def _exited(self, worker: _Worker, returncode: int, now: float) -> list[Command]:
        was = worker.state
        if was in (WorkerState.DONE, WorkerState.GONE):
            return []
        worker.state = WorkerState.DONE if returncode == 0 else WorkerState.GONE
        generation = self.generation
        member = generation is not None and worker.key in generation
        if self.phase is Phase.WAITING:
            if worker.slot is None:  # a spare died: start another
                return self._replenish(worker.key.node)
            if returncode != 0:
                return self._fall_back(
                    f"worker {worker.key} (local rank {worker.slot}) failed (status "
                    f"{returncode}) before every worker asked for a world"
                )
            self._first[was] -= 1
            self._first[WorkerState.DONE] += 1
            if self._first[WorkerState.READY]:
                return self._fall_back(_MIXED)
            if not self._first[WorkerState.STARTING]:
                return self._finish()
            return []
        if not member:
            if worker.slot is None:
                return self._replenish(worker.key.node)
            if worker.joiner:  # a joining node's worker died before it was admitted
                return self._fall_back(
                    f"worker {worker.key} of joining node {worker.key.node} failed"
                )
            return []
        assert generation is not None
        rank = generation.rank_of(worker.key)
        if returncode == 0:
            if self.phase is Phase.FORMING:
                return self._fall_back(
                    f"rank {rank} exited 0 while generation {generation.number} formed: its "
                    "world ended under it and it left worker.worlds() instead of joining the "
                    "next one (a `break` after `with world:`? put it inside the block, after "
                    "training returns)"
                )
            self._done_members += 1
            if self._done_members == generation.world_size:
                return self._finish()
            return []
        if self._finishing():
            return self._fall_back(
                f"rank {rank} failed (status {returncode}) after other ranks had finished"
            )
        self.failures += 1
        if self.failures > self.max_failures:
            return self._fall_back(
                f"rank {rank} failed (status {returncode}): {self.failures} failures in place "
                f"exceed the {self.max_failures} one attempt may replace (a failure storm)"
            )
        why = f"rank {rank} (worker {worker.key}) failed (status {returncode})"
        return self._member_gone(now, why)

    def _member_gone(self, now: float, why: str) -> list[Command]:
        """A member failed or was taken out: the next generation, its survivors' collectives
        aborted (a collective with the gone member never completes)."""
        failed_at = self._recovery.failed_at if self._recovery is not None else None
        failed_at = now if failed_at is None else failed_at
        return self._next_generation(now, why, failed_at=failed_at, abort=True)

    def _asks_of_current(self, worker: _Worker, number: int) -> bool:
        generation = self.generation
        return (
            generation is not None
            and generation.number == number
            and worker.key in generation
            and worker.state is WorkerState.MEMBER
        )

    def condemned_alive(self, key: WorkerKey) -> bool:
        """Whether a member other than ``key`` was told its error is its own and still runs
        (its exit breaks the others' collectives before its agent sees it: wait for it)."""
        return any(
            k != key and self._workers[k].state is WorkerState.MEMBER for k in self._condemned
        )

    def _verdict(self, worker: _Worker, event: VerdictDue, now: float) -> list[Command]:
        """Evict the likely hung peers, or (final) tell the asker its error is its own."""
        generation = self.generation
        if not self._asks_of_current(worker, event.generation) or worker.key in self._condemned:
            return []  # the world ended meanwhile (the end answered it), or a repeat
        assert generation is not None
        alive = [
            k
            for k in generation.members
            if self._workers[k].state is WorkerState.MEMBER and k not in self._condemned
        ]
        asked = {k for k in alive if k in self._troubled}
        hung = suspects(alive, asked)
        if hung:
            commands: list[Command] = []
            for key in hung:
                self._workers[key].state = WorkerState.GONE
                self.failures += 1
                reason = (
                    f"{len(asked)} of {len(alive)} ranks' collectives failed in generation "
                    f"{generation.number} while it answered nothing: {EvictCause.HUNG.value}"
                )
                commands.append(Evict(key, generation.number, EvictCause.HUNG, reason))
            ranks = ", ".join(str(generation.rank_of(k)) for k in hung)
            why = f"rank(s) {ranks} taken for hung"
            if self.failures > self.max_failures:
                return commands + self._fall_back(f"{why}: {self.failures} failures (a storm)")
            return commands + self._member_gone(now, why)
        if not event.final:
            return []
        self._condemned.add(worker.key)
        return [OwnError(worker.key, generation.number)]

    def _leave_due(self, worker: _Worker, event: LeaveDue, now: float) -> list[Command]:
        """Take out a survivor that was told ``event.generation`` ended and entered no later
        one since (it is stuck in that world): like a failed member, but it still runs."""
        generation = self.generation
        if (
            generation is None
            or self.phase is not Phase.FORMING
            or worker.key not in generation
            or worker.state is not WorkerState.MEMBER
            or worker.entered > event.generation
            or generation.number <= event.generation
        ):
            return []  # it left (or died, or the job moved on): nothing to do
        if self._finishing():
            return []  # pragma: no cover - a forming generation has no finished member
        worker.state = WorkerState.GONE
        self.failures += 1
        rank = generation.rank_of(worker.key)
        detail = f": {event.detail}" if event.detail else ""
        why = (
            f"rank {rank} (worker {worker.key}) was taken out: {event.cause.value} "
            f"from generation {event.generation}{detail}"
        )
        evict = Evict(worker.key, event.generation, event.cause, why)
        if self.failures > self.max_failures:
            return [evict, *self._fall_back(f"{why}: {self.failures} failures in place (a storm)")]
        return [evict, *self._member_gone(now, why)]

    def _node_lost(self, node: int, now: float, *, left: bool = False) -> list[Command]:
        state = self._nodes.pop(node, None)
        if state is None:
            return []  # a node never in the job (a joining agent says so before it joins)
        for worker in self._workers.values():
            if worker.key.node == node and worker.state not in (WorkerState.DONE, WorkerState.GONE):
                worker.state = WorkerState.GONE
        how = "left" if left else "was lost"
        # Its agent may live on (lost for a round it missed): its workers' places are given
        # away, so it stops them. One that left said so itself, and is stopping already.
        out: list[Command] = [] if left else [NodeOut(node, f"node {node} {how}")]
        if self.phase is Phase.WAITING:
            return out + self._fall_back(f"node {node} was lost before generation 1 was assigned")
        generation = self.generation
        if generation is None or all(k.node != node for k in generation.members):
            return out  # a joining node that was never admitted
        if self._finishing():
            return out + self._fall_back(f"node {node} was lost after other ranks had finished")
        return out + self._member_gone(now, f"node {node} {how}")

    def _node_joined(self, event: NodeJoined, now: float) -> list[Command]:
        if event.node in self._nodes:
            raise GenerationProtocolError(
                event, self.phase, f"node {event.node} is already in the job"
            )
        waiting = self.phase is Phase.WAITING  # before generation 1: the node is one of its own
        serial = self._next_serial_after(event.node)
        state = _Node(event.spec, serial=serial, in_world=waiting)
        self._nodes[event.node] = state
        self._nodes = dict(sorted(self._nodes.items()))
        if waiting:
            self._first[WorkerState.STARTING] += event.spec.local_world_size
        return self._spawn_node(event.node, state, joiner=not waiting)

    # -- making generations ---------------------------------------------------------------------

    def _next_generation(
        self, now: float, reason: str, *, failed_at: float | None, abort: bool = False
    ) -> list[Command]:
        generation = self.generation
        assert generation is not None
        ended = tuple(k for k in generation.members if self._workers[k].state is WorkerState.MEMBER)
        commands: list[Command] = (
            [EndWorld(generation.number, ended, reason, abort)] if ended else []
        )
        for key in ended:
            self._workers[key].state = WorkerState.READY
        return commands + self._assign(now, reason, failed_at=failed_at, first=False)

    def _assign(
        self, now: float, reason: str, *, failed_at: float | None, first: bool
    ) -> list[Command]:
        previous = self.generation
        commands: list[Command] = []
        holders: dict[tuple[int, int], _Worker] = {}  # (node, slot) -> worker
        for worker in self._workers.values():
            if worker.slot is not None and worker.state in (
                WorkerState.READY,
                WorkerState.STARTING,
            ):
                if worker.joiner and not self._joiner_node_ready(worker.key.node):
                    continue
                if worker.state is WorkerState.STARTING and first:
                    continue
                holders.setdefault((worker.key.node, worker.slot), worker)
        replacements: list[tuple[tuple[int, int], _Worker, WorkerKey | None, bool]] = []
        old_holder: dict[tuple[int, int], WorkerKey] = {}
        if previous is not None:
            for key, slot in zip(previous.members, previous.slots, strict=True):
                old_holder[(key.node, slot)] = key
        for node, state in self._nodes.items():
            if not state.in_world and not self._joiner_node_ready(node):
                continue
            state.in_world = True
            for slot in range(state.spec.local_world_size):
                if (node, slot) in holders:
                    continue
                spare = self._spare_for(node)
                if spare is not None:
                    worker = self._workers[spare]
                    worker.slot = slot
                    commands += self._replenish(node)
                    by_spare = True
                else:
                    worker = self._new_worker(node, slot)
                    commands.append(Spawn(worker.key, slot))
                    by_spare = False
                holders[(node, slot)] = worker
                replacements.append(((node, slot), worker, old_holder.get((node, slot)), by_spare))
        if not holders:
            return self._fall_back(f"{reason}: no node is left to form a world")
        members = self._rank(holders, previous)
        for worker in members:
            worker.joiner = False
        fresh = frozenset(
            w.key for w in members if self._formed_once and w.key not in self._holds_state
        )
        number = self.first_generation if previous is None else previous.number + 1
        generation = Generation(
            number,
            tuple(w.key for w in members),
            tuple(w.slot for w in members if w.slot is not None),
            fresh,
            reason,
        )
        self.generation = generation
        self._done_members = 0
        self._troubled, self._condemned = set(), set()
        self.phase = Phase.FORMING
        rank_of = {w.key: r for r, w in enumerate(members)}
        done = tuple(
            Replacement(rank_of[w.key], key[0], key[1], old, w.key, spare)
            for key, w, old, spare in replacements
        )
        self._recovery = _Recovery(failed_at, now + self.recovery_timeout, done)
        commands.append(GenerationAssigned(generation, done))
        for worker in members:
            if worker.state is WorkerState.READY:
                worker.state = WorkerState.MEMBER
                commands.append(Assign(worker.key, generation.place_of(worker.key)))
        return commands

    def _rank(
        self, holders: Mapping[tuple[int, int], _Worker], previous: Generation | None
    ) -> list[_Worker]:
        """Dense ranks: a survivor keeps its rank below the new size; the rest fill in order."""
        ordered = [holders[slot] for slot in sorted(holders)]
        size = len(ordered)
        old_rank = {} if previous is None else {k: r for r, k in enumerate(previous.members)}
        ranks: list[_Worker | None] = [None] * size
        rest = []
        for worker in ordered:
            rank = old_rank.get(worker.key)
            if rank is not None and rank < size and ranks[rank] is None:
                ranks[rank] = worker
            else:
                rest.append(worker)
        free = iter(rest)
        return [slot if slot is not None else next(free) for slot in ranks]

    def _spare_for(self, node: int) -> WorkerKey | None:
        """The spare to take a slot on ``node``: a ready one, else one still starting (it is
        further along than a process started now)."""
        starting = (
            w.key
            for w in self._workers.values()
            if w.key.node == node and w.slot is None and w.state is WorkerState.STARTING
        )
        return next(iter(self.spares(node)), None) or next(starting, None)

    def _finishing(self) -> bool:
        """Whether a member of the current generation already exited 0 (the job is ending)."""
        return self._done_members > 0

    def _admit_ready_joiners(self, now: float) -> list[Command]:
        if self._finishing():
            return []
        for node, state in self._nodes.items():
            if not state.in_world and self._joiner_node_ready(node):
                return self._next_generation(now, f"node {node} joined", failed_at=None)
        return []

    def _joiner_node_ready(self, node: int) -> bool:
        joiners = [
            w
            for w in self._workers.values()
            if w.key.node == node and w.joiner and w.slot is not None
        ]
        return bool(joiners) and all(w.state is WorkerState.READY for w in joiners)

    # -- helpers --------------------------------------------------------------------------------

    def _spawn_node(self, node: int, state: _Node, *, joiner: bool) -> list[Command]:
        commands: list[Command] = []
        for slot in range(state.spec.local_world_size):
            worker = self._new_worker(node, slot)
            worker.joiner = joiner
            commands.append(Spawn(worker.key, slot))
        for _ in range(state.spec.spares):
            commands.append(Spawn(self._new_worker(node, None).key, None))
        return commands

    def _new_worker(self, node: int, slot: int | None) -> _Worker:
        state = self._nodes[node]
        key = WorkerKey(node, state.serial)
        state.serial += 1
        worker = _Worker(key, slot)
        self._workers[key] = worker
        return worker

    def _next_serial_after(self, node: int) -> int:
        """A node that joins again must not reuse the keys of its earlier workers."""
        return 1 + max((k.serial for k in self._workers if k.node == node), default=-1)

    def _replenish(self, node: int) -> list[Command]:
        """Start spares until ``node`` has as many (ready or starting) as it should."""
        state = self._nodes.get(node)
        if state is None or self.phase in _TERMINAL:
            return []
        have = sum(
            1
            for w in self._workers.values()
            if w.key.node == node
            and w.slot is None
            and w.state in (WorkerState.STARTING, WorkerState.READY)
        )
        return [
            Spawn(self._new_worker(node, None).key, None) for _ in range(state.spec.spares - have)
        ]

    def _finish(self) -> list[Command]:
        self.phase = Phase.FINISHED
        self._recovery = None
        commands: list[Command] = [Stop(key) for key in self.alive()]
        return [*commands, Finish()]

    def _fall_back(self, reason: str) -> list[Command]:
        self.phase = Phase.FELL_BACK
        self._recovery = None
        self.fallback_reason = reason
        return [FallBack(reason)]

    def _why_not_formed(self) -> str:
        generation, recovery = self.generation, self._recovery
        assert generation is not None
        assert recovery is not None
        missing = []
        for rank, key in enumerate(generation.members):
            if key in recovery.entered:
                continue
            state = self._workers[key].state
            doing = (
                "never asked for a world" if state is WorkerState.STARTING else "did not enter it"
            )
            missing.append(f"rank {rank} (worker {key}) {doing}")
        return (
            f"generation {generation.number} did not form within {self.recovery_timeout:g} s: "
            + "; ".join(missing)
        )


def suspects(
    members: Sequence[WorkerKey], troubled: Collection[WorkerKey]
) -> tuple[WorkerKey, ...]:
    """Members to evict: when most of a generation's members saw their collectives fail while
    no member died, the silent ones are the likely hung peers (on gloo nothing else gets the
    others out). A minority in trouble is taken for its own bug: nobody is evicted."""
    silent = tuple(key for key in members if key not in troubled)
    return silent if silent and 2 * len(troubled) > len(members) else ()


# -- the replicated log ------------------------------------------------------------------------
# Across nodes, every agent runs its own replica of the job's machine. The replicas agree because
# they are fed the same events in the same order: a log in the job's store, each entry appended by
# the agent that saw it happen (a worker of its node asked, entered or exited; a node was lost or
# joined; a deadline passed). The machine is deterministic given that order; ``now`` only feeds
# reports (each replica's own clock), and deadlines enter the log as :class:`TimedOut`.


@dataclass(frozen=True, slots=True)
class Begin:
    """The first entry of a job's log: the nodes its machine starts with."""

    nodes: Mapping[int, NodeSpec]
    first_generation: int


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of a job's generation log."""

    event: Event | Begin
    by: str = ""
    """The agent that appended it (a token unique to that agent); empty for :class:`Begin`,
    which every agent writes alike."""
    serial: int = 0
    """The appender's own count: no two entries are the same bytes."""
    pid: int | None = None
    """With :class:`Ready`: the worker's process id (for reports on every node)."""


class GenerationLogError(ValueError):
    """A generation log entry could not be decoded (the message names the bytes)."""

    def __init__(self, raw: bytes, why: str) -> None:
        super().__init__(f"bad generation log entry {raw[:200]!r}: {why}")


def encode_entry(entry: LogEntry) -> bytes:
    """The bytes of ``entry`` (equal entries give equal bytes)."""
    event = entry.event
    body: object
    match event:
        case Begin():
            nodes = sorted(event.nodes.items())
            body = {
                "begin": [[n, x.local_world_size, x.spares] for n, x in nodes],
                "first": event.first_generation,
            }
        case Ready(worker=w):
            body = {"ready": [w.node, w.serial]}
        case Entered(worker=w, generation=number):
            body = {"entered": [w.node, w.serial, number]}
        case Exited(worker=w, returncode=code):
            body = {"exited": [w.node, w.serial, code]}
        case NodeLost(node=node, left=left):
            body = {"left": node} if left else {"lost": node}
        case NodeJoined(node=node, spec=spec):
            body = {"joined": [node, spec.local_world_size, spec.spares]}
        case TimedOut(generation=number):
            body = {"timeout": number}
        case LeaveDue(worker=w, generation=number, cause=cause, detail=detail):
            body = {"leave": [w.node, w.serial, number, cause.value, detail]}
        case Troubled(worker=w, generation=number):
            body = {"troubled": [w.node, w.serial, number]}
        case VerdictDue(worker=w, generation=number, final=final):
            body = {"verdict": [w.node, w.serial, number, bool(final)]}
        case Tick():
            raise ValueError("Tick is local to one machine: a replicated log carries TimedOut")
    record = {"e": body, "by": entry.by, "n": entry.serial, "pid": entry.pid}
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def decode_entry(raw: bytes) -> LogEntry:
    """The entry ``raw`` encodes; :class:`GenerationLogError` if it encodes none."""
    try:
        record = json.loads(raw)
        body, by, serial, pid = record["e"], str(record["by"]), int(record["n"]), record["pid"]
        (kind,) = (k for k in body if k != "first")
        value = body[kind]
        event: Event | Begin
        match kind:
            case "begin":
                nodes = {int(n): NodeSpec(int(size), int(spares)) for n, size, spares in value}
                event = Begin(nodes, int(body["first"]))
            case "ready":
                event = Ready(WorkerKey(int(value[0]), int(value[1])))
            case "entered":
                event = Entered(WorkerKey(int(value[0]), int(value[1])), int(value[2]))
            case "exited":
                event = Exited(WorkerKey(int(value[0]), int(value[1])), int(value[2]))
            case "lost":
                event = NodeLost(int(value))
            case "left":
                event = NodeLost(int(value), left=True)
            case "joined":
                event = NodeJoined(int(value[0]), NodeSpec(int(value[1]), int(value[2])))
            case "timeout":
                event = TimedOut(int(value))
            case "leave":
                key = WorkerKey(int(value[0]), int(value[1]))
                event = LeaveDue(key, int(value[2]), EvictCause(value[3]), str(value[4]))
            case "troubled":
                event = Troubled(WorkerKey(int(value[0]), int(value[1])), int(value[2]))
            case "verdict":
                key = WorkerKey(int(value[0]), int(value[1]))
                event = VerdictDue(key, int(value[2]), bool(value[3]))
            case _:
                raise GenerationLogError(raw, f"unknown kind {kind!r}")
    except GenerationLogError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise GenerationLogError(raw, f"{type(exc).__name__}: {exc}") from None
    return LogEntry(event, by, serial, None if pid is None else int(pid))
