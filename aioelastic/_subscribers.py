"""The callbacks subscribed to one component's typed events.

Every component that emits events (timer server, rendezvous handler, agent, etcd store, event
stream) keeps its subscribers here, so they all behave alike: a callback can unsubscribe (even
from inside a callback), and a callback that raises is logged and counted, never fatal to the
component that emitted the event. An event class that reports trouble derives from
:class:`WarningEvent`, so sinks single it out by type, not by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

E = TypeVar("E")


class WarningEvent:
    """Base of the event classes saying that something went wrong or changed (a worker failed, a
    watchdog fired, a node was fenced): the logging subscriber logs them at WARNING."""

    __slots__ = ()


class Subscribers(Generic[E]):
    """An ordered set of callbacks taking events of type ``E``."""

    def __init__(self, logger: logging.Logger, what: str, *initial: Callable[[E], object] | None):
        self._logger = logger
        self._what = what
        self._callbacks: list[Callable[[E], object]] = [c for c in initial if c is not None]
        self.errors = 0
        """How many times a callback raised."""

    def add(self, callback: Callable[[E], object]) -> Callable[[], None]:
        """Subscribe ``callback``; return a function that unsubscribes it (idempotent)."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def emit(self, event: E) -> None:
        """Deliver ``event`` to every callback, logging and counting any that raises."""
        for callback in tuple(self._callbacks):
            try:
                callback(event)
            except Exception:
                self.errors += 1
                self._logger.exception("%s subscriber %r failed on %r", self._what, callback, event)

    def __len__(self) -> int:
        return len(self._callbacks)

    def __bool__(self) -> bool:
        return bool(self._callbacks)
