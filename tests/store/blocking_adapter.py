"""The blocking client seen as an async :class:`Store`, so the conformance suite runs on it.

Each call runs in a worker thread on a connection of its own (taken from a pool, or opened),
so calls that wait and the calls that wake them run at once, as the suite's tests need.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import anyio.to_thread

from aioelastic.store import BlockingTCPStore, Snapshot, Store, StoreClosedError, Value

T = TypeVar("T")


class ThreadedBlockingStore(Store):
    """Async calls over a pool of :class:`BlockingTCPStore` views under ``prefix``."""

    def __init__(self, host: str, port: int, *, prefix: str) -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self._idle: list[BlockingTCPStore] = []
        self._every: list[BlockingTCPStore] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port} under {self.prefix + '/'!r}"

    def _take(self) -> BlockingTCPStore:
        with self._lock:
            if self._closed:
                raise StoreClosedError("the adapter was closed")
            if self._idle:
                return self._idle.pop()
        client = BlockingTCPStore(self.host, self.port, timeout=self.timeout)
        with self._lock:
            self._every.append(client)
            if self._closed:
                client.close()
        return client.scoped(self.prefix)

    def _run(self, call: Callable[[BlockingTCPStore], T]) -> T:
        view = self._take()
        result = call(view)
        with self._lock:
            self._idle.append(view)
        return result

    async def _call(self, name: str, *args: Any, **options: Any) -> Any:
        def call(view: BlockingTCPStore) -> Any:
            return getattr(view, name)(*args, **options)

        return await anyio.to_thread.run_sync(partial(self._run, call), abandon_on_cancel=True)

    async def aclose(self) -> None:
        with self._lock:
            self._closed = True
            clients = list(self._every)
        for client in clients:
            client.close()

    async def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        await self._call("set", key, value, ttl=ttl)

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        result: bytes = await self._call("get", key, timeout=timeout)
        return result

    async def add(self, key: str, amount: int) -> int:
        result: int = await self._call("add", key, amount)
        return result

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        result: bytes = await self._call("compare_set", key, expected, desired)
        return result

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self._call("wait", keys, timeout=timeout)

    async def check(self, keys: Sequence[str]) -> bool:
        result: bool = await self._call("check", keys)
        return result

    async def delete_key(self, key: str) -> bool:
        result: bool = await self._call("delete_key", key)
        return result

    async def num_keys(self) -> int:
        result: int = await self._call("num_keys")
        return result

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        result: list[bytes] = await self._call("multi_get", keys, timeout=timeout)
        return result

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        await self._call("multi_set", keys, values)

    async def append(self, key: str, value: Value) -> None:
        await self._call("append", key, value)

    async def get_prefix(self, prefix: str) -> Snapshot:
        result: Snapshot = await self._call("get_prefix", prefix)
        return result

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        result: int = await self._call("wait_for_change", prefix, after=after, timeout=timeout)
        return result

    async def ttl_remaining(self, key: str) -> float | None:
        result: float | None = await self._call("ttl_remaining", key)
        return result
