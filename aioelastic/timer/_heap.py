"""A pure deadline heap of timers keyed by ``(pid, scope_id)``.

Theory of operation: a binary heap of ``(deadline, seq, key)`` entries plus a map from key to
the live timer's fields and the ``seq`` of its current entry. Re-arming or removing a timer only
updates the map; the stale heap entry is skipped when it surfaces (lazy deletion), and the heap
is rebuilt when stale entries outnumber live ones, so memory stays O(live timers). The map holds
plain tuples and a :class:`Timer` is built only when one is handed out: a server arms and
releases timers far more often than it looks at one (a frozen dataclass costs about ten times a
tuple to build). Nothing here reads a clock: callers pass ``now``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

TimerKey = tuple[int, str]
_Entry = tuple[int, float, float, int]
"""A live timer in the map: ``(seq, deadline, expiration_time, signal)``."""


@dataclass(frozen=True, slots=True)
class Timer:
    """An armed timer: ``deadline`` is monotonic, ``expiration_time`` the wall time as sent."""

    pid: int
    scope_id: str
    deadline: float
    expiration_time: float
    signal: int

    @property
    def key(self) -> TimerKey:
        return (self.pid, self.scope_id)


class DeadlineHeap:
    """Timers ordered by deadline, with O(log n) arm and O(1) release by key or by pid."""

    _COMPACT_SLACK = 64

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerKey]] = []
        self._live: dict[TimerKey, _Entry] = {}
        self._by_pid: dict[int, set[str]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def get(self, key: TimerKey) -> Timer | None:
        """Return the live timer for ``key``, if any."""
        entry = self._live.get(key)
        return None if entry is None else _timer(key, entry)

    def arm(self, timer: Timer) -> None:
        """Add ``timer``, replacing any timer with the same key."""
        self.arm_at(timer.pid, timer.scope_id, timer.deadline, timer.expiration_time, timer.signal)

    def arm_at(
        self, pid: int, scope_id: str, deadline: float, expiration_time: float, signal: int
    ) -> None:
        """:meth:`arm` from the timer's fields, without building a :class:`Timer`."""
        key = (pid, scope_id)
        seq = next(self._seq)
        live = self._live
        if key not in live:
            scopes = self._by_pid.get(pid)
            if scopes is None:
                self._by_pid[pid] = {scope_id}
            else:
                scopes.add(scope_id)
        live[key] = (seq, deadline, expiration_time, signal)
        heapq.heappush(self._heap, (deadline, seq, key))
        if len(self._heap) > 2 * len(live) + self._COMPACT_SLACK:
            self._compact()

    def release(self, key: TimerKey) -> Timer | None:
        """Remove and return the timer for ``key``; ``None`` if there is none."""
        entry = self._pop(key)
        return None if entry is None else _timer(key, entry)

    def discard(self, key: TimerKey) -> bool:
        """Remove the timer for ``key``; whether there was one."""
        return self._pop(key) is not None

    def release_pid(self, pid: int) -> list[Timer]:
        """Remove and return every timer of ``pid``, earliest deadline first."""
        scopes = self._by_pid.pop(pid, set())
        timers = [_timer((pid, scope), self._live.pop((pid, scope))) for scope in scopes]
        self._maybe_compact()
        return sorted(timers, key=lambda t: t.deadline)

    def scopes(self, pid: int) -> frozenset[str]:
        """The scopes ``pid`` holds timers for."""
        return frozenset(self._by_pid.get(pid, ()))

    def next_deadline(self) -> float | None:
        """The earliest live deadline, or ``None`` when no timer is armed."""
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Iterator[Timer]:
        """Remove and yield the timers with ``deadline <= now``, earliest first.

        Lazily: a timer released while the caller handles an earlier one is not yielded.
        """
        while True:
            self._drop_stale_top()
            if not self._heap or self._heap[0][0] > now:
                return
            _, _, key = heapq.heappop(self._heap)
            entry = self._pop(key)
            assert entry is not None
            yield _timer(key, entry)

    def _drop_stale_top(self) -> None:
        heap, live = self._heap, self._live
        while heap:
            _, seq, key = heap[0]
            entry = live.get(key)
            if entry is not None and entry[0] == seq:
                return
            heapq.heappop(heap)

    def _pop(self, key: TimerKey) -> _Entry | None:
        entry = self._live.pop(key, None)
        if entry is None:
            return None
        pid, scope_id = key
        scopes = self._by_pid[pid]
        scopes.discard(scope_id)
        if not scopes:
            del self._by_pid[pid]
        self._maybe_compact()
        return entry

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + self._COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        self._heap = [(deadline, seq, key) for key, (seq, deadline, _, _) in self._live.items()]
        heapq.heapify(self._heap)


def _timer(key: TimerKey, entry: _Entry) -> Timer:
    _, deadline, expiration_time, signal = entry
    return Timer(key[0], key[1], deadline, expiration_time, signal)
