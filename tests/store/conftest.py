"""Store fixtures: one ``store`` fixture parametrized over every backend.

A backend ``NAME`` joins the conformance suite by appending ``NAME`` to :data:`BACKENDS` and
defining a ``NAME_store`` fixture that yields an open store. If its client cannot run on trio,
add it to :data:`ASYNCIO_ONLY`; if tests can drive its clock through the ``clock`` fixture, add
it to :data:`CLOCKED`. Tests that need to move the store's time request ``store_clock``, which
skips the backends whose time they cannot drive.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVarTuple

import anyio
import pytest

from aioelastic._clock import Timer
from aioelastic.store import (
    MemoryStore,
    PrefixStore,
    Store,
    TCPStore,
    TCPStoreServer,
    TorchStoreListener,
)
from aioelastic.testing import ManualClock
from tests.store.blocking_adapter import ThreadedBlockingStore

Ts = TypeVarTuple("Ts")

BACKENDS = ["memory", "prefix", "tcp", "etcd", "blocking", "relay"]
"""Every store backend the conformance suite runs on."""

ASYNCIO_ONLY: set[str] = {"etcd"}
"""Backends skipped on trio (their client library is asyncio-only)."""

CLOCKED = {"memory", "prefix", "tcp", "blocking", "relay"}
"""Backends whose TTLs and timeouts run on the ``clock`` fixture."""


class WatchedClock(ManualClock):
    """A manual clock that lets a test wait until tasks sleep on it (event-driven, no polling).

    A waiting store call with a finite timeout sets a deadline on its store's clock (a timer,
    or a scope), so "one more sleeper" means "the call is parked": the test then exercises the
    wake-up path.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sleeps = 0
        self._watchers: list[tuple[int, anyio.Event]] = []

    async def sleep_until(self, deadline: float) -> None:
        self._count(deadline)
        await super().sleep_until(deadline)

    def move_on_at(self, deadline: float) -> AbstractContextManager[anyio.CancelScope]:
        self._count(deadline)
        return super().move_on_at(deadline)

    def call_at(self, deadline: float, callback: Callable[[*Ts], object], *args: *Ts) -> Timer:
        self._count(deadline)
        return super().call_at(deadline, callback, *args)

    def _count(self, deadline: float) -> None:
        if self.now() < deadline < math.inf:
            self.sleeps += 1
            for count, event in self._watchers:
                if self.sleeps >= count:
                    event.set()

    async def wait_sleeps(self, count: int) -> None:
        """Return once ``count`` sleeps have started on this clock in total."""
        if self.sleeps >= count:
            return
        event = anyio.Event()
        self._watchers.append((count, event))
        with anyio.fail_after(10):
            await event.wait()


class Parked:
    """Counts the calls that park on a :class:`WatchedClock` from now on."""

    def __init__(self, clock: ManualClock) -> None:
        assert isinstance(clock, WatchedClock)
        self.clock = clock
        self.mark = clock.sleeps

    async def wait(self, count: int = 1) -> None:
        """Return once ``count`` more calls have parked than when this was created."""
        await self.clock.wait_sleeps(self.mark + count)


@pytest.fixture
def clock() -> WatchedClock:
    """The manual clock the clocked backends run on."""
    return WatchedClock()


@pytest.fixture
async def memory_store(clock: ManualClock) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(clock=clock) as store:
        yield store


@pytest.fixture
async def prefix_store(clock: ManualClock) -> AsyncIterator[PrefixStore]:
    async with MemoryStore(clock=clock) as inner:
        await inner.set("outside", b"not under the prefix")
        async with PrefixStore("job", inner) as store:
            yield store


@pytest.fixture
async def tcp_server(clock: ManualClock) -> AsyncIterator[TCPStoreServer]:
    """A real TCP store server on a free loopback port, on the test's clock."""
    async with TCPStoreServer(clock=clock) as server:
        yield server


@pytest.fixture
async def tcp_store(tcp_server: TCPStoreServer) -> AsyncIterator[TCPStore]:
    async with TCPStore("127.0.0.1", tcp_server.port) as store:
        yield store


@pytest.fixture
async def blocking_store(tcp_server: TCPStoreServer) -> AsyncIterator[Store]:
    """The blocking client (a view under ``job/``, with a key outside it), each call in a
    thread of its own connection."""
    async with TCPStore("127.0.0.1", tcp_server.port) as outside:
        await outside.set("outside", b"not under the prefix")
    async with ThreadedBlockingStore("127.0.0.1", tcp_server.port, prefix="job") as store:
        yield store


@pytest.fixture
async def relay_store(clock: ManualClock) -> AsyncIterator[TCPStore]:
    """Our client through a listener relaying our protocol to another store."""
    async with MemoryStore(clock=clock) as inner:
        await inner.set("outside", b"not under the prefix")
        relayed = PrefixStore("job", inner)
        async with (
            TorchStoreListener(relayed, native=True) as listener,
            TCPStore("127.0.0.1", listener.port) as store,
        ):
            yield store


def _backend_name(anyio_backend: Any) -> str:
    return anyio_backend[0] if isinstance(anyio_backend, tuple) else str(anyio_backend)


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest, anyio_backend: Any) -> str:
    """The name of the backend under test; skips asyncio-only backends on trio."""
    name: str = request.param
    if name in ASYNCIO_ONLY and _backend_name(anyio_backend) == "trio":
        pytest.skip(f"the {name} store's client is asyncio-only")
    return name


@pytest.fixture
def store(request: pytest.FixtureRequest, store_backend: str) -> Store:
    """An open store of each backend in :data:`BACKENDS`."""
    resolved: Store = request.getfixturevalue(f"{store_backend}_store")
    return resolved


@pytest.fixture
def store_clock(store_backend: str, clock: ManualClock) -> ManualClock:
    """The clock of the store under test; skips backends whose time a test cannot move."""
    if store_backend not in CLOCKED:
        pytest.skip(f"the {store_backend} store's clock cannot be driven by a test")
    return clock
