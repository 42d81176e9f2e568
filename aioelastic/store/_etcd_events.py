"""The events and the statistics snapshot of :class:`~aioelastic.store.EtcdStore`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from aioelastic._subscribers import Subscribers, WarningEvent

logger = logging.getLogger("aioelastic.store._etcd")


@dataclass(frozen=True, slots=True)
class EtcdLeaseLost(WarningEvent):
    """A lease this store held expired before it was renewed; its keys were deleted.

    ``key`` is the TTL key that lease carried, or None for the store's session lease.
    """

    lease_id: int
    key: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class EtcdFailover(WarningEvent):
    """A call to ``endpoint`` failed; the store moved on to the next endpoint."""

    endpoint: str
    detail: str


@dataclass(frozen=True, slots=True)
class EtcdWatchResumed:
    """A wait re-opened its watch from ``start_revision`` after its stream failed."""

    start_revision: int
    endpoint: str
    detail: str


EtcdStoreEvent = EtcdLeaseLost | EtcdFailover | EtcdWatchResumed


@dataclass(frozen=True, slots=True)
class EtcdStoreStatistics:
    """A snapshot of an :class:`EtcdStore`."""

    endpoints: str
    current_endpoint: str
    session_lease: int | None
    ttl_leases: int
    failovers: int
    leases_lost: int
    watches_resumed: int
    outcome_checks: int
    requests: int


class EtcdEvents:
    """The store's subscribers and the counters its statistics report."""

    def __init__(self, on_event: Callable[[EtcdStoreEvent], object] | None) -> None:
        self._subscribers: Subscribers[EtcdStoreEvent] = Subscribers(
            logger, "etcd store event", on_event
        )
        self.failovers = 0
        self.leases_lost = 0
        self.watches_resumed = 0
        self.outcome_checks = 0

    def subscribe(self, callback: Callable[[EtcdStoreEvent], object]) -> Callable[[], None]:
        """Call ``callback`` with every event; return a function that unsubscribes it."""
        return self._subscribers.add(callback)

    def emit(self, event: EtcdStoreEvent) -> None:
        """Count and log ``event``, then hand it to every subscriber."""
        if isinstance(event, EtcdLeaseLost):
            self.leases_lost += 1
            logger.warning("etcd lease %x lost (%s): %s", event.lease_id, event.key, event.detail)
        elif isinstance(event, EtcdFailover):
            self.failovers += 1
            logger.info("etcd endpoint %s failed: %s", event.endpoint, event.detail)
        else:
            self.watches_resumed += 1
        self._subscribers.emit(event)
