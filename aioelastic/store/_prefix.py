"""A view of another store in which every key lives under ``prefix/``."""

from __future__ import annotations

import math
from collections.abc import Coroutine, Sequence
from typing import Any

from aioelastic.store._api import Snapshot, Store, Value
from aioelastic.store._errors import StoreTimeoutError


class PrefixStore(Store):
    """A :class:`Store` that reads and writes ``store`` under ``prefix + "/"``.

    Like torch's ``PrefixStore``, it does not own ``store``: closing the view leaves the
    underlying store open. :meth:`num_keys` counts only the keys under the prefix.

    A call whose result needs no rewriting hands back the inner store's own coroutine (a
    waiting node holds one coroutine fewer: see :class:`~aioelastic.store._memory.Call`), as
    does a wait without a timeout (no timeout error to name the caller's keys in).
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"the prefix must be str, not {type(prefix).__name__}")
        self.prefix = prefix
        self.store = store
        self.timeout = store.timeout
        self._head = f"{prefix}/"

    @property
    def endpoint(self) -> str:
        return f"{self.store.endpoint} under {self._head!r}"

    def _key(self, key: str) -> str:
        if not isinstance(key, str):
            raise TypeError(f"store keys must be str, not {type(key).__name__}")
        return self._head + key

    def _keys(self, keys: Sequence[str]) -> list[str]:
        return [self._key(key) for key in keys]

    def _unprefixed(self, error: StoreTimeoutError) -> StoreTimeoutError:
        """Name the caller's keys, not the prefixed ones, in a timeout."""
        size = len(self._head)
        keys = [key[size:] if key.startswith(self._head) else key for key in error.keys]
        return StoreTimeoutError(keys, error.timeout, self.endpoint)

    def set(self, key: str, value: Value, *, ttl: float | None = None) -> Coroutine[Any, Any, None]:
        return self.store.set(self._key(key), value, ttl=ttl)

    def get(self, key: str, *, timeout: float | None = None) -> Coroutine[Any, Any, bytes]:
        if timeout == math.inf:
            return self.store.get(self._key(key), timeout=timeout)
        return self._get(key, timeout)

    async def _get(self, key: str, timeout: float | None) -> bytes:
        try:
            return await self.store.get(self._key(key), timeout=timeout)
        except StoreTimeoutError as error:
            raise self._unprefixed(error) from None

    def add(self, key: str, amount: int) -> Coroutine[Any, Any, int]:
        return self.store.add(self._key(key), amount)

    def compare_set(self, key: str, expected: Value, desired: Value) -> Coroutine[Any, Any, bytes]:
        return self.store.compare_set(self._key(key), expected, desired)

    def wait(
        self, keys: Sequence[str], *, timeout: float | None = None
    ) -> Coroutine[Any, Any, None]:
        if timeout == math.inf:
            return self.store.wait(self._keys(keys), timeout=timeout)
        return self._wait(keys, timeout)

    async def _wait(self, keys: Sequence[str], timeout: float | None) -> None:
        try:
            await self.store.wait(self._keys(keys), timeout=timeout)
        except StoreTimeoutError as error:
            raise self._unprefixed(error) from None

    def check(self, keys: Sequence[str]) -> Coroutine[Any, Any, bool]:
        return self.store.check(self._keys(keys))

    def delete_key(self, key: str) -> Coroutine[Any, Any, bool]:
        return self.store.delete_key(self._key(key))

    async def num_keys(self) -> int:
        return len((await self.store.get_prefix(self._head)).items)

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        try:
            return await self.store.multi_get(self._keys(keys), timeout=timeout)
        except StoreTimeoutError as error:
            raise self._unprefixed(error) from None

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> Coroutine[Any, Any, None]:
        return self.store.multi_set(self._keys(keys), values)

    def append(self, key: str, value: Value) -> Coroutine[Any, Any, None]:
        return self.store.append(self._key(key), value)

    async def get_prefix(self, prefix: str) -> Snapshot:
        return self._unprefixed_snapshot(await self.store.get_prefix(self._key(prefix)))

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        snapshots = await self.store.get_prefixes(self._keys(prefixes))
        return [self._unprefixed_snapshot(snapshot) for snapshot in snapshots]

    def _unprefixed_snapshot(self, snapshot: Snapshot) -> Snapshot:
        size = len(self._head)
        return Snapshot(snapshot.revision, {k[size:]: v for k, v in snapshot.items.items()})

    def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> Coroutine[Any, Any, int]:
        if timeout == math.inf:
            return self.store.wait_for_change(self._key(prefix), after=after, timeout=timeout)
        return self._wait_for_change(prefix, after, timeout)

    async def _wait_for_change(self, prefix: str, after: int, timeout: float | None) -> int:
        try:
            return await self.store.wait_for_change(self._key(prefix), after=after, timeout=timeout)
        except StoreTimeoutError as error:
            raise self._unprefixed(error) from None

    @property
    def counts_keys(self) -> bool:
        return self.store.counts_keys

    def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> Coroutine[Any, Any, int]:
        return self.store.multi_set_and_count(self._keys(keys), values, prefix=self._key(prefix))

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        count, snapshot = await self.store.multi_set_count_and_read(
            self._keys(keys), values, prefix=self._key(prefix), read=self._key(read)
        )
        return count, self._unprefixed_snapshot(snapshot)

    def ttl_remaining(self, key: str) -> Coroutine[Any, Any, float | None]:
        return self.store.ttl_remaining(self._key(key))
