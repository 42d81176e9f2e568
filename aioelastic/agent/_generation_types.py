"""The generation protocol's vocabulary: who (workers, nodes, generations), what happens to
them (events, the machine's inputs) and what the machine asks for (commands, its outputs).

Plain frozen records, no behaviour beyond lookups; the rules are in :mod:`._generations`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
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
