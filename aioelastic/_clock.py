"""Clocks: the source of ``now`` for the async shells, injectable so tests control time.

Cores never read a clock; shells ask a :class:`Clock`. Production code uses
:class:`MonotonicClock` (the event loop's monotonic clock); tests use
:class:`aioelastic.testing.ManualClock` and move time by hand.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import anyio


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock that async code can sleep on."""

    def now(self) -> float:
        """Return the current time in seconds (monotonic, arbitrary origin)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline``."""
        ...


class MonotonicClock:
    """The running event loop's monotonic clock (``anyio.current_time``)."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep_until(deadline)

    def __repr__(self) -> str:
        return "MonotonicClock()"
