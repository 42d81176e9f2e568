"""The part every timer server shares: apply requests to the deadline heap, expire at deadlines.

A server owns a :class:`DeadlineHeap` and one expiry task that sleeps until the earliest
deadline (woken early when an earlier one is armed), then hands each due timer to the
subclass's ``_on_expired``. Deadlines are on the server's monotonic clock: a request's wall-clock
``expiration_time`` is converted once, when it arrives, so a later wall-clock step does not
move it. Subclasses feed requests in (``_apply``), decide who may hold timers (``_admit``) and
how to reap.
"""

from __future__ import annotations

import abc
import logging
import math
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVarTuple

import anyio
from anyio.abc import TaskGroup, TaskStatus

from aioelastic._clock import Clock, MonotonicClock
from aioelastic._service import Service
from aioelastic._subscribers import Subscribers
from aioelastic.timer._codec import Rejection, RequestFields, TimerRequest
from aioelastic.timer._events import (
    RejectReason,
    RequestRejected,
    TimerAcquired,
    TimerEvent,
    TimerExpired,
    TimerReleased,
    TimerServerStatistics,
)
from aioelastic.timer._heap import DeadlineHeap, Timer

logger = logging.getLogger("aioelastic.timer")

LogEvent = Callable[[str, TimerRequest | None], None]
"""PyTorch's ``log_event(name, request)`` hook: "watchdog started", "timer expired", ..."""

EventCallback = Callable[[TimerEvent], None]

PosArgs = TypeVarTuple("PosArgs")

_LOGGED_REJECTIONS = 10


class ProcessGone(Rejection):
    """What ``_admit`` answers for a process that had exited by the time its acquire was read.

    The line was written while it lived, so the acquire is honoured if the same read also
    holds its release (it did hold the timer, and gave it back before exiting); otherwise it
    is rejected as no such process, since nothing is left to watch.
    """


def _last_releases(items: list[RequestFields | Rejection]) -> dict[tuple[int, str], int]:
    """The position of the last release of each ``(pid, scope_id)`` among ``items``."""
    return {
        (item[0], item[1]): index
        for index, item in enumerate(items)
        if type(item) is tuple and item[2] < 0
    }


def as_request(timer: Timer) -> TimerRequest:
    """The request that armed ``timer`` (what ``log_event`` receives)."""
    return TimerRequest(timer.pid, timer.scope_id, timer.expiration_time, timer.signal)


class TimerServerBase(Service):
    """Heap, expiry task, events and statistics; subclasses add a request source and reaping."""

    def __init__(
        self,
        run_id: str,
        *,
        log_event: LogEvent | None,
        on_event: EventCallback | None,
        clock: Clock | None,
        wall_clock: Callable[[], float],
    ) -> None:
        self.run_id = run_id
        self._log_event = log_event
        self._subscribers: Subscribers[TimerEvent] = Subscribers(logger, "timer event", on_event)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._wall_clock = wall_clock
        self._heap = DeadlineHeap()
        self._task_group: TaskGroup | None = None
        self._sleep_scope: anyio.CancelScope | None = None
        self._sleeping_until = math.inf
        self._requests = 0
        self._acquires = 0
        self._releases = 0
        self._expired = 0
        self._reaped = 0
        self._rejected: Counter[RejectReason] = Counter()
        self._last_progress = wall_clock()

    # -- public surface -------------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Deliver every event to ``callback``; returns a function that unsubscribes it."""
        return self._subscribers.add(callback)

    def statistics(self) -> TimerServerStatistics:
        """A snapshot of the counters."""
        return TimerServerStatistics(
            active_timers=len(self._heap),
            watched_processes=self._watched_processes(),
            requests=self._requests,
            acquires=self._acquires,
            releases=self._releases,
            expired=self._expired,
            reaped=self._reaped,
            rejected=dict(self._rejected),
        )

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``await task_group.start(server.serve)`` returns once ready."""
        if self._task_group is not None:
            raise RuntimeError(f"{type(self).__name__} is already serving")
        self._open_source()
        try:
            async with anyio.create_task_group() as group:
                self._task_group = group
                group.start_soon(self._serve_requests)
                group.start_soon(self._expire_loop)
                self._last_progress = self._wall_clock()
                self._log("watchdog started", None)
                task_status.started()
        finally:
            self._task_group = None
            self._close_source()
            self._log("watchdog stopped", None)

    # -- for subclasses -------------------------------------------------------------------

    @abc.abstractmethod
    def _open_source(self) -> None:
        """Get the request source ready (raise here on bad configuration)."""

    @abc.abstractmethod
    async def _serve_requests(self) -> None:
        """Read requests from the source and ``_apply`` them, forever."""

    def _before_expiry(self) -> None:
        """Apply requests already sent but not read yet (a release just before its deadline)."""

    @abc.abstractmethod
    def _close_source(self) -> None:
        """Release what ``_open_source`` acquired."""

    @abc.abstractmethod
    def _admit(self, pid: int) -> Rejection | None:
        """Decide whether ``pid`` may hold timers (``None`` = yes)."""

    @abc.abstractmethod
    def _on_expired(self, timer: Timer, expired: TimerExpired) -> None:
        """Act on an expired timer (already removed from the heap and reported)."""

    def _watched_processes(self) -> int:
        return 0

    def _emit(self, event: TimerEvent) -> None:
        self._subscribers.emit(event)

    def _log(self, name: str, request: TimerRequest | None) -> None:
        if self._log_event is not None:
            try:
                self._log_event(name, request)
            except Exception:
                logger.exception("log_event failed on %r", name)

    def _spawn(
        self, func: Callable[[*PosArgs], Coroutine[Any, Any, None]], *args: *PosArgs
    ) -> None:
        assert self._task_group is not None
        self._task_group.start_soon(func, *args)

    def _apply(self, items: list[RequestFields | Rejection]) -> None:
        """Apply decoded requests in order; a rejection costs only its own line.

        The requests of one read are judged as of when they were written: an acquire from a
        process gone by now stands if a release of the same scope follows in ``items`` (see
        :class:`ProcessGone`), so a process that acquires, releases and exits before the
        server reads loses nothing, however long its requests waited in the pipe.
        """
        now, wall = self._clock.now(), self._wall_clock()
        offset = now - wall
        heap, emit, admit = self._heap, bool(self._subscribers), self._admit
        earliest = math.inf
        requests = acquires = releases = 0
        released: dict[tuple[int, str], int] | None = None
        for item in items:
            requests += 1
            if isinstance(item, Rejection):
                self._reject(item)
                continue
            pid, scope_id, expiration_time, signal = item
            if expiration_time < 0:
                releases += 1
                if heap.discard((pid, scope_id)) and emit:
                    self._emit(TimerReleased(pid, scope_id))
                continue
            rejection = admit(pid)
            deadline = expiration_time + offset
            if rejection is None:
                if deadline < earliest:
                    earliest = deadline
            elif type(rejection) is ProcessGone:
                if released is None:
                    released = _last_releases(items)
                if released.get((pid, scope_id), -1) < requests:  # this item is requests - 1
                    self._reject(rejection)
                    continue
                # Armed until its release below, in this call: it can never expire.
            else:
                self._reject(rejection)
                continue
            acquires += 1
            heap.arm_at(pid, scope_id, deadline, expiration_time, signal)
            if emit:
                self._emit(TimerAcquired(pid, scope_id, deadline, expiration_time, signal))
        self._requests += requests
        self._acquires += acquires
        self._releases += releases
        self._last_progress = wall
        if earliest < self._sleeping_until and self._sleep_scope is not None:
            self._sleeping_until = -math.inf
            self._sleep_scope.cancel()

    def _reject(self, rejection: Rejection) -> None:
        count = self._rejected[rejection.reason] = self._rejected[rejection.reason] + 1
        # Every rejection is counted and emitted; the log is thinned so a flood of bad lines
        # cannot flood it too: the first few of each reason, then one in a thousand.
        if count <= _LOGGED_REJECTIONS or count % 1000 == 0:
            logger.warning(
                "timer server %r dropped a request (%s, %d so far): %s",
                self.run_id,
                rejection.reason.value,
                count,
                rejection.detail,
            )
        if self._subscribers:
            self._emit(RequestRejected(rejection.reason, rejection.detail, rejection.pid))

    async def _expire_loop(self) -> None:
        while True:
            deadline = self._heap.next_deadline()
            with anyio.CancelScope() as scope:
                self._sleep_scope = scope
                self._sleeping_until = math.inf if deadline is None else deadline
                if deadline is None:
                    await anyio.sleep_forever()
                else:
                    await self._clock.sleep_until(deadline)
            self._sleep_scope = None
            self._before_expiry()
            self._expire_due(self._clock.now())

    def _expire_due(self, now: float) -> None:
        for timer in self._heap.pop_due(now):
            self._expired += 1
            expired = TimerExpired(
                timer.pid,
                timer.scope_id,
                timer.deadline,
                timer.expiration_time,
                timer.signal,
                late=now - timer.deadline,
            )
            logger.info(  # the reap that follows is the warning
                "timer %r of pid %d expired (%.3f s late)", timer.scope_id, timer.pid, expired.late
            )
            self._emit(expired)
            self._log("timer expired", as_request(timer))
            self._on_expired(timer, expired)
        self._last_progress = self._wall_clock()
