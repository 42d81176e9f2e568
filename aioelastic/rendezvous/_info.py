"""What a completed rendezvous hands out, and why a completed round stops being valid."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aioelastic.store import Store


@dataclass(frozen=True, slots=True)
class RendezvousStoreInfo:
    """Where the workers' own store lives: rank 0's address and a port free on it."""

    master_addr: str
    master_port: int


@dataclass(frozen=True, slots=True)
class RendezvousInfo:
    """The outcome of a round for one node.

    ``store`` is a store private to this round (shared by its participants); ``rank`` is
    unique in ``0..world_size-1``. ``round`` numbers the rounds of the run (0 where a backend
    has none): two live worlds never share one, so workers can fence writes with it.
    """

    store: Store
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo
    round: int = 0


class InvalidationReason(enum.Enum):
    """Why the round a handler last completed is no longer valid."""

    NODES_WAITING = "nodes_waiting"
    """Nodes are waiting to join: the job should re-rendezvous to admit them."""
    PARTICIPANT_LOST = "participant_lost"
    """A participant of the round stopped heart-beating or left."""
    CLOSED = "closed"
    """The rendezvous was closed: the job is over."""
    FENCED = "fenced"
    """This node could not renew its liveness in time: others may have taken its ranks."""
    RESTARTING = "restarting"
    """Another node restarts the job's workers; every node starts the next attempt together
    (``static``, whose one set of members otherwise never changes)."""
    STORE_LOST = "store_lost"
    """The rendezvous store's server is gone (its host left or died): the job cannot go on."""


@dataclass(frozen=True, slots=True)
class RoundInvalidated:
    """The round a handler last completed is no longer valid, and why."""

    reason: InvalidationReason
    detail: str


@dataclass(frozen=True, slots=True)
class RoundJoining:
    """Event: this node started joining (``next_rendezvous`` was called)."""

    run_id: str
    node: int


@dataclass(frozen=True, slots=True)
class RoundCompleted:
    """Event: this node is ``rank`` of ``world_size`` in round ``round``."""

    run_id: str
    round: int
    node: int
    rank: int
    world_size: int


@dataclass(frozen=True, slots=True)
class NodeLost:
    """Event: this node reported ``lost`` (its ring successor in ``round``) gone."""

    run_id: str
    round: int
    lost: int


RendezvousEvent = RoundJoining | RoundCompleted | RoundInvalidated | NodeLost
"""What an elastic handler tells its subscribers (``RoundInvalidated`` says why a round ended)."""


@dataclass(frozen=True, slots=True)
class RendezvousStatistics:
    """A snapshot of an elastic handler."""

    node: int
    """This handler's node id in the run (0 before ``async with``)."""
    joining: bool
    rounds_completed: int
    round: int
    """The round last completed (0 if none)."""
    rank: int
    world_size: int
    invalidated: RoundInvalidated | None
    """Why the last completed round is no longer valid, or None while it is."""


@dataclass(frozen=True, slots=True)
class StaticRendezvousStatistics:
    """A snapshot of a static handler (one round at most: the world size is fixed)."""

    rank: int
    """The configured rank of this node."""
    world_size: int
    joining: bool
    rounds_completed: int
    """1 once every rank arrived, else 0."""
    invalidated: RoundInvalidated | None
    """Set once this handler saw the run closed, else None."""
