"""Sharing work between concurrent calls on one EtcdStore: combined adds, shared reads/watches.

Flat combining of concurrent ``add`` calls on one key into one store write.

On etcd an ``add`` is a read and a compare-and-set; N tasks adding to one counter at once
would retry O(N^2) times. Instead, callers queue their amounts; whoever holds the key's lock
writes the sum of everything queued in one exactly-once update, then hands each caller the
total it would have seen had the adds run one after another, in queue order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskGroup

from aioelastic.store._api import Snapshot

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class _Entry:
    """One call waiting in a batch: done once a batch answered it (a result or an error)."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = False
        self.result = 0
        self.error: BaseException | None = None


E = TypeVar("E", bound=_Entry)


class _Batches(Generic[E]):
    """The queue and lock of a combiner; ``users`` counts the calls inside."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._queue: list[E] = []
        self.users = 0

    async def _join(self, entry: E, serve: Callable[[], Awaitable[None]]) -> int:
        """Queue ``entry``; whoever holds the lock runs ``serve()`` (a batch of the queue) until
        ``entry`` is answered; its result (or its error, raised). An entry cancelled while
        queued leaves the queue: it was never sent."""
        self._queue.append(entry)
        self.users += 1
        try:
            async with self._lock:
                while not entry.done:
                    await serve()
        except BaseException:
            if entry in self._queue:
                self._queue.remove(entry)
            raise
        finally:
            self.users -= 1
        if entry.error is not None:
            raise entry.error
        return entry.result


class _Pending(_Entry):
    __slots__ = ("amount",)

    def __init__(self, amount: int) -> None:
        super().__init__()
        self.amount = amount


class AddCombiner(_Batches[_Pending]):
    """Combines the concurrent adds to one key; ``users`` counts the calls inside."""

    async def add(
        self,
        amount: int,
        apply: Callable[[int], Awaitable[int]],
        unknown: Callable[[], BaseException],
    ) -> int:
        """Add ``amount``; ``apply(total)`` writes a combined total and returns the new value.

        When the caller writing a batch is cancelled, the others in that batch get
        ``unknown()`` (their add may or may not have been applied); a caller cancelled while
        queued is taken out of the queue (its add is never applied).
        """
        entry = _Pending(amount)
        return await self._join(entry, lambda: self._write_batch(entry, apply, unknown))

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


class CountedWrite(_Entry):
    """One ``multi_set_and_count`` call waiting in a :class:`CountedWrites` batch; ``read``
    is the prefix it also reads in the transaction (``multi_set_count_and_read``), and
    ``snapshot`` what that read found."""

    __slots__ = ("puts", "read", "snapshot")

    def __init__(self, puts: dict[bytes, bytes], read: bytes | None = None) -> None:
        super().__init__()
        self.puts = puts
        self.read = read
        self.snapshot: Snapshot | None = None


class CountedWrites(_Batches[CountedWrite]):
    """Combines concurrent counted writes under one prefix into one transaction.

    Whoever holds the lock sends the queued writes in one batch: each write's puts, then a
    count, so each count still sees every write before it and none after (distinct counts, as
    if sent one by one); then one range read of each prefix the writes ask to read, which
    sees every write of the batch. A batch holds at most ``limit`` puts and never the same key twice
    with two values (etcd refuses a transaction that writes a key twice; a key already written
    in the batch with the same value is written once). A writer cancelled mid-batch leaves the
    batch's other writes queued, to be sent again by the next (their puts are idempotent).
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit

    async def write(
        self,
        puts: dict[bytes, bytes],
        send: Callable[[list[CountedWrite]], Awaitable[list[int]]],
    ) -> int:
        """Write ``puts`` and return the count; ``send(batch)`` returns the batch's counts."""
        count, _ = await self.write_and_read(puts, send, None)
        return count

    async def write_and_read(
        self,
        puts: dict[bytes, bytes],
        send: Callable[[list[CountedWrite]], Awaitable[list[int]]],
        read: bytes | None,
    ) -> tuple[int, Snapshot | None]:
        """:meth:`write`, and what the read of ``read`` found (None without one): ``send``
        also sets the snapshot of each entry that reads."""
        entry = CountedWrite(puts, read)
        count = await self._join(entry, lambda: self._send_batch(send))
        return count, entry.snapshot

    def _take_batch(self) -> list[CountedWrite]:
        batch: list[CountedWrite] = []
        written: dict[bytes, bytes] = {}
        reads: set[bytes] = set()
        for entry in list(self._queue):
            if any(written.get(key, value) != value for key, value in entry.puts.items()):
                continue  # would write a key twice with two values: the next batch
            new = {k: v for k, v in entry.puts.items() if k not in written}
            more = {entry.read} - reads if entry.read is not None else set()
            ops = len(written) + len(new) + len(batch) + 1 + len(reads) + len(more)
            if batch and ops > self._limit:
                break
            written.update(new)
            reads |= more
            batch.append(entry)
        for entry in batch:
            self._queue.remove(entry)
        return batch

    async def _send_batch(self, send: Callable[[list[CountedWrite]], Awaitable[list[int]]]) -> None:
        batch = self._take_batch()
        try:
            counts = await send(batch)
        except Exception as error:
            for pending in batch:
                pending.error, pending.done = error, True
            return
        except BaseException:
            self._queue[:0] = batch  # the others are sent again by the next lock holder
            raise
        for pending, count in zip(batch, counts, strict=True):
            pending.result, pending.done = count, True


class _Flight(Generic[T]):
    __slots__ = ("done", "error", "result", "scope", "started", "waiters")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.scope = anyio.CancelScope()
        self.started = False
        self.waiters = 0
        self.result: T | None = None
        self.error: BaseException | None = None


class SharedCalls(Generic[K, T]):
    """Concurrent calls with equal keys share one execution (one request to etcd).

    The execution runs as a task in the store's task group, not in any caller, so a caller
    that is cancelled never fails the others; once every caller has gone it is cancelled.
    ``join_running`` says whether a caller may join an execution that already started: yes
    for a watch (its answer does not depend on when it began), no for a read (which must be
    sent after the call began, or it could return a value older than the call).
    """

    def __init__(self, *, join_running: bool, closed: Callable[[], BaseException]) -> None:
        self._join_running = join_running
        self._closed = closed
        self._flights: dict[K, _Flight[T]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def call(self, task_group: TaskGroup, key: K, run: Callable[[], Awaitable[T]]) -> T:
        """Return the result of ``run()``, shared with concurrent calls of the same ``key``."""
        flight = self._flights.get(key)
        if flight is None or (flight.started and not self._join_running):
            flight = _Flight()
            self._flights[key] = flight
            task_group.start_soon(self._execute, key, flight, run, task_group)
        flight.waiters += 1
        try:
            await flight.done.wait()
        finally:
            flight.waiters -= 1
            if not flight.waiters and not flight.done.is_set() and self._join_running:
                # Every caller left a watch: stop it, and let later callers start afresh.
                # (A read is short: it finishes, and new callers never join a started one.)
                flight.scope.cancel()
                if self._flights.get(key) is flight:
                    del self._flights[key]
        if flight.error is not None:
            raise flight.error
        return flight.result  # type: ignore[return-value]  # set whenever error is not

    async def _execute(
        self,
        key: K,
        flight: _Flight[T],
        run: Callable[[], Awaitable[T]],
        task_group: TaskGroup,
    ) -> None:
        try:
            with flight.scope:
                flight.started = True
                flight.result = await run()
                return
            flight.error = self._closed()  # cancelled: only callers that already left see it
        except Exception as error:
            flight.error = error
        except BaseException:
            flight.error = self._closed()
            if task_group.cancel_scope.cancel_called:
                raise  # the store is closing
            # grpc re-raises our cancellation as a bare CancelledError that the scope does not
            # recognise; every caller has left, so end quietly.
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            flight.done.set()
