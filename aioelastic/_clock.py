"""Clocks: the source of ``now`` for the async shells, injectable so tests control time.

Cores never read a clock; shells ask a :class:`Clock`. Production code uses
:class:`MonotonicClock` (the event loop's monotonic clock); tests use
:class:`aioelastic.testing.ManualClock` and move time by hand. A shell that must stop waiting at
a deadline opens :func:`move_on_at` on its clock, never an alarm task of its own.

A clock may also set timers (:class:`TimerClock`: both clocks here do). On asyncio a deadline is
then one timer, where an anyio cancel scope is several objects (the scope, two sets, its timer
with its context and bound method): where thousands of simulated nodes share a process, each object
a waiting call holds is one more for every full collection of the cyclic garbage collector to
walk. A clock that only offers :meth:`Clock.move_on_at` keeps working: the helpers fall back to it.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Protocol, TypeVarTuple, cast, runtime_checkable

import anyio

Ts = TypeVarTuple("Ts")


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


class Timer(Protocol):
    """A callback set to run at a deadline (what :meth:`TimerClock.call_at` returns)."""

    def cancel(self) -> None:
        """Never run the callback (a no-op once it ran)."""
        ...


@runtime_checkable
class TimerClock(Clock, Protocol):
    """A :class:`Clock` that can also call back at a deadline, on a running asyncio loop."""

    def call_at(self, deadline: float, callback: Callable[[*Ts], object], *args: *Ts) -> Timer:
        """Call ``callback(*args)`` once ``now() >= deadline``, unless the timer is cancelled
        first. A deadline already reached calls back soon, from the loop (never from within
        ``call_at``). The callback must not raise, nor rely on context variables."""
        ...


def timer_clock(clock: Clock) -> TimerClock | None:
    """``clock`` if it sets timers, else None (a look-up, not a protocol's isinstance walk)."""
    return cast(TimerClock, clock) if hasattr(clock, "call_at") else None


class DeadlineScope(Protocol):
    """What :func:`move_on_at` gives the block: whether the deadline ended it."""

    @property
    def cancelled_caught(self) -> bool: ...


def move_on_at(clock: Clock, deadline: float) -> AbstractContextManager[DeadlineScope]:
    """Stop the block once ``clock`` reaches ``deadline``: :meth:`Clock.move_on_at`'s meaning.

    The block's cancellation stops here, ``cancelled_caught`` says whether the deadline ended
    the block, and a cancellation from outside is never swallowed (an anyio scope's that comes
    in the deadline's own turn reaches the task at its next checkpoint, as anyio delivers
    every cancellation, rather than through the block). On asyncio with a
    :class:`TimerClock` it is one timer that cancels the task, as :func:`asyncio.timeout` does
    (see :class:`TaskDeadline`); elsewhere it is the clock's own scope. For blocks that wait
    (an event, a store call), not for ones that shield work inside them.
    """
    timers = timer_clock(clock)
    if timers is not None and asyncio._get_running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:
            return TaskDeadline(timers, deadline, task)
    return clock.move_on_at(deadline)


class TaskDeadline:
    """A deadline as one timer that cancels the task in the block (:func:`move_on_at` on asyncio).

    The task is cancelled once, as :func:`asyncio.timeout` does: the ``CancelledError`` ends
    the block and is swallowed here only if no other cancellation of the task came meanwhile
    (the task's ``cancelling()`` count says). Unlike an anyio scope it is delivered once, not
    at every checkpoint until the block is left, and an anyio scope shielded inside the block
    does not hold it off: it is for blocks that wait. A deadline already reached cancels at
    the block's first yield to the loop; a block that never yields runs to its end.
    """

    __slots__ = ("_cancelling", "_caught", "_clock", "_deadline", "_expired", "_task", "_timer")

    def __init__(self, clock: TimerClock, deadline: float, task: asyncio.Task[object]) -> None:
        self._clock, self._deadline, self._task = clock, deadline, task
        self._timer: Timer | None = None
        self._expired = False
        self._cancelling = 0
        self._caught = False

    @property
    def cancelled_caught(self) -> bool:
        """Whether the deadline ended the block (known once the block is left)."""
        return self._caught

    def __enter__(self) -> TaskDeadline:
        self._cancelling = self._task.cancelling()
        if self._deadline != math.inf:
            self._timer = self._clock.call_at(self._deadline, self)  # itself: no bound method
        return self

    def __call__(self) -> None:
        """The timer: the deadline is reached."""
        self._expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if self._expired:
            self._expired = False
            # Ours alone: no other cancellation came since the block was entered.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                self._caught = True
        return self._caught


_timer_contexts = threading.local()


def timer_context() -> contextvars.Context:
    """The empty context this thread's clock timers run their callbacks in.

    asyncio copies the caller's context for each timer: one tracked object more a waiting
    call. A timer's callback here only wakes or cancels what waits, so it needs none, and
    one context a thread is never entered twice at once (a loop runs one callback at a time).
    """
    try:
        context: contextvars.Context = _timer_contexts.context
    except AttributeError:
        context = _timer_contexts.context = contextvars.Context()
    return context


class MonotonicClock:
    """The running event loop's monotonic clock (``anyio.current_time``)."""

    def now(self) -> float:
        loop = asyncio._get_running_loop()  # what anyio.current_time() reads on asyncio, less
        return loop.time() if loop is not None else anyio.current_time()  # its backend lookup

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep_until(deadline)

    def move_on_at(self, deadline: float) -> anyio.CancelScope:
        return anyio.CancelScope(deadline=deadline)  # the loop's own deadline: no task

    def call_at(self, deadline: float, callback: Callable[[*Ts], object], *args: *Ts) -> Timer:
        """The running asyncio loop's own timer (:meth:`asyncio.loop.call_at`), its callback
        run in an empty context (see :func:`timer_context`)."""
        return asyncio.get_running_loop().call_at(
            deadline, callback, *args, context=timer_context()
        )

    def __repr__(self) -> str:
        return "MonotonicClock()"
