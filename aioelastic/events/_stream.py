"""One stream of typed events across the parts, and the record every subscriber receives.

Each component already emits its own frozen dataclasses to its own subscribers (the timer
server's ``TimerReaped``, the agent's ``WorkerFailed``, the rendezvous handler's verdicts, the
etcd store's ``EtcdFailover``). An :class:`EventStream` subscribes to several of them and
delivers each event, stamped with when, where and from which component, as one
:class:`EventRecord` to its own subscribers: the logging subscriber, the JSON-lines writer, the
Prometheus metrics, or a test. A subscriber that raises is logged and counted; it never breaks
the component that emitted the event, nor the other subscribers.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aioelastic._subscribers import Subscribers

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One event as the stream delivers it.

    ``time`` is this host's wall clock when the stream received the event (for humans and
    timelines; never compared across hosts for liveness). ``node`` names the host or simulated
    node, ``source`` the component (``agent``, ``timer``, ``rendezvous``, ``store``).
    ``event`` is the component's own frozen dataclass, unchanged.
    """

    time: float
    node: str
    source: str
    event: Any

    @property
    def kind(self) -> str:
        """The event's class name (``WorkerFailed``, ``TimerReaped``, ...)."""
        return type(self.event).__name__


Subscriber = Callable[[EventRecord], None]
"""A callable receiving every record; it must not block (hand slow work to a task)."""


class Emitter(Protocol):
    """A component with the project's subscriber API: ``subscribe(callback) -> unsubscribe``."""

    def subscribe(self, callback: Callable[[Any], None], /) -> Callable[[], None]: ...


@dataclass(frozen=True, slots=True)
class EventStreamStatistics:
    """A snapshot of an :class:`EventStream`: records delivered per kind, subscriber failures."""

    published: int
    subscribers: int
    subscriber_errors: int
    by_kind: Mapping[str, int] = field(default_factory=dict)


class EventStream:
    """Fans typed events from many components out to many subscribers, as :class:`EventRecord`.

    ```python
    stream = EventStream()
    stream.subscribe(LoggingSubscriber())
    stream.attach(agent, "agent")        # any object with subscribe(callback) -> unsubscribe
    ```
    ``node`` defaults to this host's name; ``clock`` (default ``time.time``) stamps records.
    """

    def __init__(self, *, node: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.node = node if node is not None else socket.gethostname()
        self._clock = clock
        self._subscribers: Subscribers[EventRecord] = Subscribers(logger, "event")
        self._published = 0
        self._by_kind: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"EventStream(node={self.node!r}, subscribers={len(self._subscribers)})"

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Deliver every later record to ``callback``; returns a function that unsubscribes it."""
        return self._subscribers.add(callback)

    def publish(self, source: str, event: object, *, node: str | None = None) -> EventRecord:
        """Stamp ``event`` from ``source`` and deliver it to every subscriber; return the record.

        ``node`` overrides the stream's node name (a simulation publishing for many nodes).
        """
        record = EventRecord(self._clock(), self.node if node is None else node, source, event)
        self._published += 1
        self._by_kind[record.kind] += 1
        self._subscribers.emit(record)
        return record

    def publisher(self, source: str, *, node: str | None = None) -> Callable[[object], None]:
        """A callback publishing each event it is given as coming from ``source`` (on ``node``)."""

        def publish(event: object) -> None:
            self.publish(source, event, node=node)

        return publish

    def attach(
        self, component: Emitter, source: str, *, node: str | None = None
    ) -> Callable[[], None]:
        """Publish every event ``component`` emits as coming from ``source`` (on ``node``).

        Returns a function that detaches the component.
        """
        return component.subscribe(self.publisher(source, node=node))

    def statistics(self) -> EventStreamStatistics:
        """Return a snapshot of the counters."""
        return EventStreamStatistics(
            published=self._published,
            subscribers=len(self._subscribers),
            subscriber_errors=self._subscribers.errors,
            by_kind=dict(self._by_kind),
        )
