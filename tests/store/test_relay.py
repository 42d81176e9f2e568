"""A listener relaying our protocol to another store (``TorchStoreListener(native=True)``).

The conformance suite runs our async client through such a relay (backend ``relay``); these
check what is particular to relaying: torch's and our clients on one port in one keyspace, a
withdrawn wait leaving the backing store, a backing store that fails, a new keyspace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import TypeVar

import anyio
import anyio.abc
import pytest

from aioelastic.store import (
    MemoryStore,
    PrefixStore,
    StoreConnectionError,
    StoreOutcomeUnknownError,
    TCPStore,
    TCPStoreServer,
    TorchStoreListener,
)
from tests.store.torch_client import TorchClientProcess

pytestmark = pytest.mark.anyio


T = TypeVar("T")


class WatchedStore(MemoryStore):
    """A memory store that says when a call parks on a missing key and when it leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.parked = anyio.Event()
        self.left = anyio.Event()

    async def _wait_keys(
        self, keys: Sequence[str], timeout: float | None, pick: Callable[[list[bytes]], T]
    ) -> T:
        if self.get_nowait(keys) is None:
            self.parked.set()
        try:
            return await super()._wait_keys(keys, timeout, pick)
        finally:
            self.left.set()


@pytest.fixture
async def inner() -> AsyncIterator[MemoryStore]:
    async with MemoryStore() as store:
        yield store


async def test_a_wait_withdrawn_by_the_client_leaves_the_backing_store() -> None:
    """Cancelling a relayed get cancels the relay's own wait on the backing store."""
    inner = WatchedStore()
    async with (
        inner,
        TorchStoreListener(inner, native=True) as listener,
        TCPStore("127.0.0.1", listener.port) as client,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(client.get, "never", timeout=60))
            with anyio.fail_after(30):
                await inner.parked.wait()
            tg.cancel_scope.cancel()
        with anyio.fail_after(30):
            await inner.left.wait()
        assert inner.statistics().key_waiters == 0


async def test_a_failing_backing_store_hangs_up_with_an_unknown_outcome() -> None:
    """The job's store goes away under the relay: our client's add reports an unknown
    outcome (the relay cannot know either), and a later set a connection error."""
    stop, stopped = anyio.Event(), anyio.Event()

    async def serve(*, task_status: anyio.abc.TaskStatus[int]) -> None:
        async with TCPStoreServer() as server:
            task_status.started(server.port)
            await stop.wait()
        stopped.set()

    async with anyio.create_task_group() as tg:
        port = await tg.start(serve)
        async with (
            TCPStore("127.0.0.1", port, connect_timeout=0.5) as backing,
            TorchStoreListener(backing, native=True) as listener,
            TCPStore("127.0.0.1", listener.port, connect_timeout=0.5, timeout=5) as client,
        ):
            assert await client.add("n", 1) == 1
            stop.set()
            await stopped.wait()
            with pytest.raises(StoreOutcomeUnknownError):
                await client.add("n", 1)
            with pytest.raises(StoreConnectionError):
                await client.set("k", b"v")
            assert listener.relay_statistics().store_failures >= 1


async def test_a_new_store_is_a_new_epoch(inner: MemoryStore) -> None:
    """use_store() changes the epoch, so a reconnecting client learns its keys are gone."""
    listener = TorchStoreListener(inner, native=True)
    before = listener.epoch
    listener.use_store(PrefixStore("next", inner))
    assert listener.epoch != before


async def test_torch_and_our_clients_share_one_port_and_keyspace(inner: MemoryStore) -> None:
    """A torch client and our client on one native listener read each other's writes."""
    pytest.importorskip("torch")
    child = TorchClientProcess()
    try:
        async with (
            TorchStoreListener(PrefixStore("worlds", inner), native=True) as listener,
            TCPStore("127.0.0.1", listener.port) as ours,
        ):
            await child(f"connect('t', {listener.port})")
            await child("clients['t'].set('from-torch', 'a')")
            await ours.set("from-us", b"b")
            assert await ours.get("from-torch") == b"a"
            assert await child("clients['t'].get('from-us')") == b"b"
            await child("clients.clear()")
        assert await inner.get("worlds/from-torch") == b"a"
    finally:
        child.close()


async def test_relay_statistics_count_our_connections_and_their_requests(
    inner: MemoryStore,
) -> None:
    """relay_statistics() counts our protocol's connections, requests and held waits, open and
    closed; torch's connections are the torch service's."""
    async with TorchStoreListener(inner, native=True) as listener:
        async with TCPStore("127.0.0.1", listener.port) as client:
            await client.set("k", b"v")
            assert await client.get("k") == b"v"
            open_now = listener.relay_statistics()
        closed = listener.relay_statistics()
        with anyio.fail_after(10):
            while closed.connections:  # the close reaches the listener a moment later
                await anyio.wait_all_tasks_blocked()
                closed = listener.relay_statistics()
    assert (open_now.connections, open_now.connections_total, open_now.requests) == (1, 1, 2)
    assert (closed.connections, closed.connections_total, closed.requests) == (0, 1, 2)
    assert closed.bad_requests == closed.store_failures == closed.waiting_requests == 0
