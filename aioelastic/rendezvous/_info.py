"""What a completed rendezvous hands out, and a handler's statistics.

Why a completed round stops being valid, and the other events a handler reports, are kept in
``aioelastic/_kinds/rendezvous.py`` (below the views that read them) and re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from aioelastic._kinds.rendezvous import (
    InvalidationReason,
    NodeLost,
    RendezvousEvent,
    RoundCompleted,
    RoundInvalidated,
    RoundJoining,
)
from aioelastic.store import Store

__all__ = [
    "InvalidationReason",
    "NodeLost",
    "RendezvousEvent",
    "RendezvousInfo",
    "RendezvousStatistics",
    "RendezvousStoreInfo",
    "RoundCompleted",
    "RoundInvalidated",
    "RoundJoining",
    "StaticRendezvousStatistics",
]


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
