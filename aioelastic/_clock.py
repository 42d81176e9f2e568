"""Clocks: the source of ``now`` for the async shells, injectable so tests control time.

Cores never read a clock; shells ask a :class:`Clock`. Production code uses
:class:`MonotonicClock` (the event loop's monotonic clock); tests use
:class:`aioelastic.testing.ManualClock` and move time by hand. A shell that must stop waiting at
a deadline opens :meth:`Clock.move_on_at` on its clock, never an alarm task of its own.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import anyio


@runtime_checkable
class Clock(Protocol):
    """A monotonic clock that async code can sleep on and set deadlines on."""

    def now(self) -> float:
        """Return the current time in seconds (monotonic, arbitrary origin)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline``."""
        ...

    def move_on_at(self, deadline: float) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope cancelled once ``now() >= deadline`` (at once if it already is).

        As with :func:`anyio.move_on_after`, the block's cancellation stops at the scope;
        ``scope.cancelled_caught`` says whether the deadline ended the block.
        """
        ...


class MonotonicClock:
    """The running event loop's monotonic clock (``anyio.current_time``)."""

    def now(self) -> float:
        loop = asyncio._get_running_loop()  # what anyio.current_time() reads on asyncio, less
        return loop.time() if loop is not None else anyio.current_time()  # its backend lookup

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep_until(deadline)

    def move_on_at(self, deadline: float) -> anyio.CancelScope:
        return anyio.CancelScope(deadline=deadline)  # the loop's own deadline: no task

    def __repr__(self) -> str:
        return "MonotonicClock()"
