"""Clocks for tests of what uses a clock: one that records how deadlines were set, and a
user's clock without timers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVarTuple

import anyio

from aioelastic._clock import Timer
from aioelastic.testing import ManualClock

Ts = TypeVarTuple("Ts")


class RecordingClock(ManualClock):
    """A manual clock that records which of its ways to set a deadline was used."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self.used: list[str] = []

    def move_on_at(self, deadline: float) -> AbstractContextManager[anyio.CancelScope]:
        self.used.append("scope")
        return super().move_on_at(deadline)

    def call_at(self, deadline: float, callback: Callable[[*Ts], object], *args: *Ts) -> Timer:
        self.used.append("timer")
        return super().call_at(deadline, callback, *args)


class ScopeOnlyClock:
    """A user's clock without timers (now, sleep_until, move_on_at), over a manual clock."""

    def __init__(self, start: float = 0.0) -> None:
        self.inner = ManualClock(start)

    def now(self) -> float:
        return self.inner.now()

    async def sleep_until(self, deadline: float) -> None:
        await self.inner.sleep_until(deadline)

    def move_on_at(self, deadline: float) -> AbstractContextManager[anyio.CancelScope]:
        return self.inner.move_on_at(deadline)

    def advance(self, seconds: float) -> None:
        self.inner.advance(seconds)

    @property
    def sleepers(self) -> int:
        return self.inner.sleepers
