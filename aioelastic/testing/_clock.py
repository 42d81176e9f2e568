"""A clock that only moves when a test says so."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVarTuple

import anyio

from aioelastic._clock import Timer

Ts = TypeVarTuple("Ts")


class ManualClock:
    """A :class:`aioelastic._clock.TimerClock` whose time moves only through :meth:`advance`.

    Tasks sleeping in :meth:`sleep_until` wake, :meth:`move_on_at` scopes are cancelled and
    :meth:`call_at` timers run when :meth:`advance` moves time to their deadline, so timing
    logic is tested without real sleeps. A sleeper that is cancelled, a scope left before its
    deadline or a timer cancelled is forgotten.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._due: list[tuple[float, int]] = []  # heap of (deadline, token)
        self._wakers: dict[int, Callable[[], object]] = {}  # token -> wake-up, while waiting
        self._tokens = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        token = self._register(deadline, event.set)
        try:
            await event.wait()
        finally:
            self._forget(token)

    @contextmanager
    def move_on_at(self, deadline: float) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            if deadline <= self._now:
                scope.cancel()
                yield scope
            elif deadline == math.inf:
                yield scope
            else:
                token = self._register(deadline, scope.cancel)
                try:
                    yield scope
                finally:
                    self._forget(token)

    def call_at(self, deadline: float, callback: Callable[[*Ts], object], *args: *Ts) -> Timer:
        """Call ``callback(*args)`` from :meth:`advance` once it reaches ``deadline``; one
        already reached is called soon by the running asyncio loop."""
        if deadline <= self._now:
            return asyncio.get_running_loop().call_soon(callback, *args)
        timer = ManualTimer(self, callback, args)
        timer.token = self._register(deadline, timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``; wake every sleeper, cancel every scope and run
        every timer whose deadline is reached (in the order of their deadlines)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds!r})")
        self._now += seconds
        due, wakers = self._due, self._wakers
        while due and due[0][0] <= self._now:
            wake = wakers.pop(heapq.heappop(due)[1], None)
            if wake is not None:
                wake()

    @property
    def sleepers(self) -> int:
        """How many wait on this clock: tasks sleeping or inside a scope with a deadline,
        and timers set."""
        return len(self._wakers)

    def _register(self, deadline: float, wake: Callable[[], object]) -> int:
        token = next(self._tokens)
        heapq.heappush(self._due, (deadline, token))
        self._wakers[token] = wake
        return token

    def _forget(self, token: int) -> None:
        """Drop a waiter that left before its deadline (a no-op once it was woken)."""
        if self._wakers.pop(token, None) is None:
            return
        if len(self._due) > 2 * len(self._wakers) + 32:  # mostly the forgotten: compact
            self._due = [entry for entry in self._due if entry[1] in self._wakers]
            heapq.heapify(self._due)

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now!r})"


class ManualTimer:
    """A callback set on a :class:`ManualClock` (what :meth:`ManualClock.call_at` returns)."""

    __slots__ = ("_args", "_callback", "_clock", "token")

    def __init__(
        self, clock: ManualClock, callback: Callable[..., object], args: tuple[Any, ...]
    ) -> None:
        self._clock, self._callback, self._args = clock, callback, args
        self.token = -1

    def __call__(self) -> None:
        self._callback(*self._args)

    def cancel(self) -> None:
        """Never run the callback (a no-op once it ran)."""
        self._clock._forget(self.token)
