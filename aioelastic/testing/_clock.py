"""A clock that only moves when a test says so."""

from __future__ import annotations

import heapq
import itertools

import anyio


class ManualClock:
    """A :class:`aioelastic._clock.Clock` whose time moves only through :meth:`advance`.

    Tasks sleeping in :meth:`sleep_until` wake when time reaches their deadline, so timing
    logic is tested without real sleeps.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        heapq.heappush(self._sleepers, (deadline, next(self._order), event))
        await event.wait()

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake every sleeper whose deadline passed."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds!r})")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()

    @property
    def sleepers(self) -> int:
        """How many tasks are sleeping on this clock (wake-ups already due included)."""
        return len(self._sleepers)

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now!r})"
