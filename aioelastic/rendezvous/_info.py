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
    unique in ``0..world_size-1``.
    """

    store: Store
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo


class InvalidationReason(enum.Enum):
    """Why the round a handler last completed is no longer valid."""

    NODES_WAITING = "nodes_waiting"
    """Nodes are waiting to join: the job should re-rendezvous to admit them."""
    PARTICIPANT_LOST = "participant_lost"
    """A participant of the round stopped heart-beating or left."""
    CLOSED = "closed"
    """The rendezvous was closed: the job is over."""


@dataclass(frozen=True, slots=True)
class RoundInvalidated:
    """The round a handler last completed is no longer valid, and why."""

    reason: InvalidationReason
    detail: str
