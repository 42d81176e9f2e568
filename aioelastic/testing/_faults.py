"""Fault injection for stores: cut one node off the store, or hold chosen calls until released.

:class:`FaultyStore` wraps any :class:`~aioelastic.store.Store` (one wrapper per simulated node
over a shared store). While partitioned, every call fails with
:class:`~aioelastic.store.StoreConnectionError`, calls already in flight included, exactly as a
lost connection looks to the code under test. A :class:`Stall` holds the calls of the
operations it names until the test releases it, so a test orders events without sleeping.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from aioelastic.store import Snapshot, Store, StoreConnectionError, Value

T = TypeVar("T")

OPERATIONS = frozenset(
    {
        "set",
        "get",
        "add",
        "compare_set",
        "wait",
        "check",
        "delete_key",
        "num_keys",
        "multi_get",
        "multi_set",
        "multi_set_and_count",
        "multi_set_count_and_read",
        "append",
        "get_prefix",
        "get_prefixes",
        "wait_for_change",
        "ttl_remaining",
    }
)
"""The store operations a :class:`Stall` can name."""

_HELD_AS = {"get_prefixes": "get_prefix"}
"""Operations a stall of another operation holds too: a read of several prefixes is a
``get_prefix`` of each, so a stall of ``get_prefix`` holds it whichever call the code makes."""


class Stall:
    """Holds calls to some store operations until :meth:`release` (created by ``stall()``)."""

    def __init__(self, operations: frozenset[str]) -> None:
        self.operations = operations
        self.held = 0
        """How many calls are held right now."""
        self._released = anyio.Event()
        self._changed = anyio.Event()

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released.is_set()

    def matches(self, operation: str) -> bool:
        """Whether calls of ``operation`` are held (an empty set of operations holds all)."""
        return not self.released and (
            not self.operations
            or operation in self.operations
            or _HELD_AS.get(operation) in self.operations
        )

    async def hold(self) -> None:
        """Block the calling store operation until the stall is released."""
        self.held += 1
        self._changed.set()
        self._changed = anyio.Event()
        try:
            await self._released.wait()
        finally:
            self.held -= 1

    async def wait_held(self, count: int = 1) -> None:
        """Return once at least ``count`` calls are held."""
        while self.held < count:
            await self._changed.wait()

    def release(self) -> None:
        """Let the held calls (and every later one) through."""
        self._released.set()

    def __repr__(self) -> str:
        names = ", ".join(sorted(self.operations)) or "every operation"
        return f"Stall({names}, held={self.held}, released={self._released.is_set()})"


@dataclass(frozen=True, slots=True)
class FaultyStoreStatistics:
    """A snapshot of a :class:`FaultyStore`: calls made, calls failed by a partition, held now."""

    calls: int
    failed: int
    held: int
    partitioned: bool
    keys_read: int = 0
    """Values returned to this view so far (one per key a get, multi_get or get_prefix read)."""


class FaultyStore(Store):
    """A view of ``store`` that a test can partition or stall; ``name`` appears in errors."""

    def __init__(self, store: Store, *, name: str = "node") -> None:
        self.inner = store
        self.name = name
        self.timeout = store.timeout
        self._partitioned = False
        self._in_flight: set[anyio.CancelScope] = set()
        self._stalls: list[Stall] = []
        self._calls = 0
        self._failed = 0
        self._keys_read = 0

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r}, name={self.name!r})"

    @property
    def endpoint(self) -> str:
        return f"{self.inner.endpoint} (as seen by {self.name})"

    @property
    def partitioned(self) -> bool:
        """Whether this view is cut off from the store."""
        return self._partitioned

    def partition(self) -> None:
        """Cut this view off: calls in flight and every later call fail until :meth:`heal`."""
        self._partitioned = True
        for scope in self._in_flight:
            scope.cancel()

    def heal(self) -> None:
        """Reconnect this view to the store."""
        self._partitioned = False

    def stall(self, *operations: str) -> Stall:
        """Hold calls of ``operations`` (method names; none: every call) until released."""
        unknown = set(operations) - OPERATIONS
        if unknown:
            raise ValueError(
                f"cannot stall {sorted(unknown)}: not store operations; "
                f"choose among {sorted(OPERATIONS)}"
            )
        stall = Stall(frozenset(operations))
        self._stalls.append(stall)
        return stall

    def statistics(self) -> FaultyStoreStatistics:
        """Return a snapshot of the calls seen."""
        return FaultyStoreStatistics(
            calls=self._calls,
            failed=self._failed,
            held=sum(stall.held for stall in self._stalls),
            partitioned=self._partitioned,
            keys_read=self._keys_read,
        )

    def _lost(self, operation: str) -> StoreConnectionError:
        self._failed += 1
        return StoreConnectionError(
            self.endpoint, f"{self.name} is partitioned from the store ({operation} failed)"
        )

    async def _call(self, operation: str, call: Coroutine[Any, Any, T]) -> T:
        """Await ``call`` (the inner store's call, not started yet) unless partitioned or
        stalled. Taking the coroutine itself, not a function making it, spares a closure a
        call: a node's waiting calls hold no more than the inner store's."""
        self._calls += 1
        scope = anyio.CancelScope()
        try:
            if self._partitioned:
                raise self._lost(operation)
            self._in_flight.add(scope)
            with scope:
                if self._stalls:
                    self._stalls = [s for s in self._stalls if not s.released]
                    for stall in self._stalls:
                        if stall.matches(operation):
                            await stall.hold()
                return await call
        finally:
            self._in_flight.discard(scope)
            call.close()  # a call never started (partitioned, or cut off while held)
        raise self._lost(operation)

    # -- the Store contract, each call through _call ------------------------------------------

    async def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        await self._call("set", self.inner.set(key, value, ttl=ttl))

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        value = await self._call("get", self.inner.get(key, timeout=timeout))
        self._keys_read += 1
        return value

    async def add(self, key: str, amount: int) -> int:
        return await self._call("add", self.inner.add(key, amount))

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return await self._call("compare_set", self.inner.compare_set(key, expected, desired))

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self._call("wait", self.inner.wait(keys, timeout=timeout))

    async def check(self, keys: Sequence[str]) -> bool:
        return await self._call("check", self.inner.check(keys))

    async def delete_key(self, key: str) -> bool:
        return await self._call("delete_key", self.inner.delete_key(key))

    async def num_keys(self) -> int:
        return await self._call("num_keys", self.inner.num_keys())

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        values = await self._call("multi_get", self.inner.multi_get(keys, timeout=timeout))
        self._keys_read += len(values)
        return values

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        await self._call("multi_set", self.inner.multi_set(keys, values))

    @property
    def counts_keys(self) -> bool:
        return self.inner.counts_keys

    async def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> int:
        return await self._call(
            "multi_set_and_count",
            self.inner.multi_set_and_count(keys, values, prefix=prefix),
        )

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        count, snapshot = await self._call(
            "multi_set_count_and_read",
            self.inner.multi_set_count_and_read(keys, values, prefix=prefix, read=read),
        )
        self._keys_read += len(snapshot.items)
        return count, snapshot

    async def append(self, key: str, value: Value) -> None:
        await self._call("append", self.inner.append(key, value))

    async def get_prefix(self, prefix: str) -> Snapshot:
        snapshot = await self._call("get_prefix", self.inner.get_prefix(prefix))
        self._keys_read += len(snapshot.items)
        return snapshot

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        snapshots = await self._call("get_prefixes", self.inner.get_prefixes(prefixes))
        self._keys_read += sum(len(snapshot.items) for snapshot in snapshots)
        return snapshots

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        return await self._call(
            "wait_for_change",
            self.inner.wait_for_change(prefix, after=after, timeout=timeout),
        )

    async def ttl_remaining(self, key: str) -> float | None:
        return await self._call("ttl_remaining", self.inner.ttl_remaining(key))
