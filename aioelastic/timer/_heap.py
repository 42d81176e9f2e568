"""A pure deadline heap of timers keyed by ``(pid, scope_id)``.

Theory of operation: a binary heap of ``(deadline, seq, key)`` entries plus a map from key to
the live timer and the ``seq`` of its current entry. Re-arming or removing a timer only updates
the map; the stale heap entry is skipped when it surfaces (lazy deletion), and the heap is
rebuilt when stale entries outnumber live ones, so memory stays O(live timers). Nothing here
reads a clock: callers pass ``now``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

TimerKey = tuple[int, str]


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
        self._live: dict[TimerKey, tuple[int, Timer]] = {}
        self._by_pid: dict[int, set[str]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def get(self, key: TimerKey) -> Timer | None:
        """Return the live timer for ``key``, if any."""
        entry = self._live.get(key)
        return entry[1] if entry is not None else None

    def arm(self, timer: Timer) -> None:
        """Add ``timer``, replacing any timer with the same key."""
        key = timer.key
        seq = next(self._seq)
        if key not in self._live:
            self._by_pid.setdefault(timer.pid, set()).add(timer.scope_id)
        self._live[key] = (seq, timer)
        heapq.heappush(self._heap, (timer.deadline, seq, key))
        self._maybe_compact()

    def release(self, key: TimerKey) -> Timer | None:
        """Remove and return the timer for ``key``; ``None`` if there is none."""
        entry = self._live.pop(key, None)
        if entry is None:
            return None
        scopes = self._by_pid[key[0]]
        scopes.discard(key[1])
        if not scopes:
            del self._by_pid[key[0]]
        self._maybe_compact()
        return entry[1]

    def release_pid(self, pid: int) -> list[Timer]:
        """Remove and return every timer of ``pid``, earliest deadline first."""
        scopes = self._by_pid.pop(pid, set())
        timers = [self._live.pop((pid, scope))[1] for scope in scopes]
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
            timer = self.release(key)
            assert timer is not None
            yield timer

    def _drop_stale_top(self) -> None:
        heap, live = self._heap, self._live
        while heap:
            _, seq, key = heap[0]
            entry = live.get(key)
            if entry is not None and entry[0] == seq:
                return
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + self._COMPACT_SLACK:
            self._heap = [(t.deadline, seq, key) for key, (seq, t) in self._live.items()]
            heapq.heapify(self._heap)
