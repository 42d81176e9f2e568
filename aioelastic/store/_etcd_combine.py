"""Flat combining of concurrent ``add`` calls on one key into one store write.

On etcd an ``add`` is a read and a compare-and-set; N tasks adding to one counter at once
would retry O(N^2) times. Instead, callers queue their amounts; whoever holds the key's lock
writes the sum of everything queued in one exactly-once update, then hands each caller the
total it would have seen had the adds run one after another, in queue order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


class _Pending:
    __slots__ = ("amount", "done", "error", "result")

    def __init__(self, amount: int) -> None:
        self.amount = amount
        self.done = False
        self.result = 0
        self.error: BaseException | None = None


class AddCombiner:
    """Combines the concurrent adds to one key; ``users`` counts the calls inside."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._queue: list[_Pending] = []
        self.users = 0

    async def add(
        self,
        amount: int,
        apply: Callable[[int], Awaitable[int]],
        unknown: Callable[[], BaseException],
    ) -> int:
        """Add ``amount``; ``apply(total)`` writes a combined total and returns the new value.

        When the caller writing a batch is cancelled, the others in that batch get
        ``unknown()`` (their add may or may not have been applied).
        """
        entry = _Pending(amount)
        self._queue.append(entry)
        self.users += 1
        try:
            async with self._lock:
                if not entry.done:
                    await self._write_batch(entry, apply, unknown)
        finally:
            self.users -= 1
        if entry.error is not None:
            raise entry.error
        return entry.result

    async def _write_batch(
        self,
        entry: _Pending,
        apply: Callable[[int], Awaitable[int]],
        unknown: Callable[[], BaseException],
    ) -> None:
        batch, self._queue = self._queue, []
        total = sum(pending.amount for pending in batch)
        try:
            value = await apply(total)
        except BaseException as error:
            for pending in batch:
                if pending is not entry:
                    pending.error = error if isinstance(error, Exception) else unknown()
                    pending.done = True
            raise
        running = value - total
        for pending in batch:
            running += pending.amount
            pending.result, pending.done = running, True
