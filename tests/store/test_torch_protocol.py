"""Torch 2.13's own ``TCPStore`` client against our store server, and mixed with our clients.

The torch client runs in a child process (:mod:`tests.store.torch_client`): some of its calls
hold the GIL while they block, which would stall a server in the same process.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import pytest

from aioelastic.store import (
    MemoryStore,
    PrefixStore,
    TCPStore,
    TCPStoreServer,
    TorchStoreListener,
)
from aioelastic.store._torch_codec import TorchOp, TorchRequest, encode_request
from aioelastic.store._torch_session import TorchService
from aioelastic.testing import ManualClock
from tests.store.torch_client import TorchCallError, TorchClientProcess

pytest.importorskip("torch")

pytestmark = [pytest.mark.anyio, pytest.mark.torch]

VALIDATE = encode_request(TorchRequest(TorchOp.VALIDATE, (0x3C85F7CE,)))


T = TypeVar("T")


class ParkingStore(MemoryStore):
    """A memory store that lets a test wait, without polling, until a call parks on a key."""

    def __init__(self, *, clock: ManualClock | None = None) -> None:
        super().__init__(clock=clock)
        self.parked = 0
        self._watchers: list[tuple[int, anyio.Event]] = []

    async def _wait_keys(
        self, keys: Sequence[str], timeout: float | None, pick: Callable[[list[bytes]], T]
    ) -> T:
        if self.get_nowait(keys) is None:
            self.parked += 1
            for count, event in self._watchers:
                if self.parked >= count:
                    event.set()
        return await super()._wait_keys(keys, timeout, pick)

    async def wait_parked(self, count: int) -> None:
        """Return once ``count`` calls in all have parked on a missing key."""
        if self.parked < count:
            event = anyio.Event()
            self._watchers.append((count, event))
            await event.wait()


def parking_server(**options: object) -> TCPStoreServer:
    """A TCP store server whose one keyspace is a :class:`ParkingStore`."""
    clock = options.pop("clock", None)
    server = TCPStoreServer(**options)  # type: ignore[arg-type]
    server.store = ParkingStore(clock=clock)  # type: ignore[arg-type]
    server.torch = TorchService(server.store, max_value_size=server.max_frame_size)
    return server


@pytest.fixture
def anyio_backend() -> str:
    """asyncio only: the torch client is the same on every loop, and each call is slow;
    ``test_tcp_server`` checks the protocol sniffing on every loop with raw bytes."""
    return "asyncio"


@pytest.fixture(scope="module")
def child() -> Iterator[TorchClientProcess]:
    process = TorchClientProcess()
    yield process
    process.close()


@pytest.fixture
async def server() -> AsyncIterator[TCPStoreServer]:
    async with parking_server() as running:
        yield running


@pytest.fixture
async def torch(child: TorchClientProcess, server: TCPStoreServer) -> AsyncIterator[Torch]:
    """Torch client ``c`` connected to ``server``; every client is closed after the test."""
    await child(f"connect('c', {server.port})")
    yield Torch(child)
    await child("clients.clear()")


class Torch:
    """Calls on the torch clients in the child: ``await torch.c("get('k')")``."""

    def __init__(self, child: TorchClientProcess) -> None:
        self.child = child

    async def c(self, call: str, client: str = "c") -> object:
        return await self.child(f"clients[{client!r}].{call}")


async def test_set_get_add_as_torch_tests_them(torch: Torch) -> None:
    """torch's own set/get sequence: adds return sums, num_keys counts, delete removes."""
    for call in ["add('key', 1)", "add('key', 2)", "add('key', 3)", "set('key0', 'value0')"]:
        await torch.c(call)
    for amount in range(1, 7):
        assert sum(range(1, amount + 1)) == await torch.c(f"add('key3', {amount})")
    await torch.c("set('key1', 'value1')")
    await torch.c("set('key2', 'value2')")
    assert await torch.c("num_keys()") == 5
    assert [await torch.c(f"get({key!r})") for key in ("key", "key0", "key1", "key2", "key3")] == [
        b"6",
        b"value0",
        b"value1",
        b"value2",
        b"21",
    ]
    await torch.c("set('-key3', '7')")
    assert await torch.c("get('-key3')") == b"7"
    assert True is await torch.c("delete_key('-key3')")
    assert False is await torch.c("delete_key('-key3')")
    assert await torch.c("num_keys()") == 5


async def test_compare_set_as_torch_tests_it(torch: Torch) -> None:
    """compare_set on a missing key returns the expected value and stores nothing."""
    assert await torch.c("compare_set('cs0', 'wrong_old_value', 'new0')") == b"wrong_old_value"
    assert False is await torch.c("check(['cs0'])")
    await torch.c("set('cs0', 'value0')")
    assert await torch.c("compare_set('cs0', 'wrong_old_value', 'new0')") == b"value0"
    assert await torch.c("compare_set('cs0', 'value0', 'new0')") == b"new0"
    assert await torch.c("get('cs0')") == b"new0"
    assert await torch.c("compare_set('cs1', '', 'new1')") == b"new1"
    assert await torch.c("get('cs1')") == b"new1"


async def test_wait_timeout_raises_torchs_error_and_the_connection_goes_on(
    torch: Torch, server: TCPStoreServer
) -> None:
    """A wait that times out raises torch's timeout; the server withdraws it; calls go on."""
    with pytest.raises(TorchCallError, match="wait timeout after 250ms, keys: /bad_key") as error:
        await torch.c("wait(['bad_key'], timedelta(seconds=0.25))")
    assert error.value.kind == "DistStoreError"
    assert server.statistics().waiting_requests == 0
    await torch.c("add('good_key', 1)")
    assert None is await torch.c("wait(['good_key'])")
    assert await torch.c("get('good_key')") == b"1"


async def test_get_of_a_missing_key_times_out(torch: Torch) -> None:
    """get waits for the key and raises torch's timeout error when it never comes."""
    await torch.child("clients['c'].set_timeout(timedelta(seconds=0.3))")
    with pytest.raises(TorchCallError, match="wait timeout after 300ms"):
        await torch.c("get('never')")
    await torch.c("set('now', 'here')")
    assert await torch.c("get('now')") == b"here"


async def test_check_append_multi_get_multi_set(torch: Torch) -> None:
    """check, append, multi_set and multi_get behave as on torch's server."""
    assert False is await torch.c("check(['a', 'b'])")
    await torch.c("append('a', 'x')")
    await torch.c("append('a', 'yz')")
    await torch.c("multi_set(['b', 'c'], ['1', '2'])")
    assert True is await torch.c("check(['a', 'b', 'c'])")
    assert await torch.c("multi_get(['a', 'b', 'c'])") == [b"xyz", b"1", b"2"]
    assert sorted(await torch.c("list_keys()")) == ["a", "b", "c"]  # type: ignore[type-var]


async def test_queues(torch: Torch, child: TorchClientProcess, server: TCPStoreServer) -> None:
    """Queue push/len/pop; a non-blocking pop of an empty queue raises; check sees a queue."""
    await torch.c("queue_push('q', 'one')")
    await torch.c("queue_push('q', 'two')")
    assert await torch.c("queue_len('q')") == 2
    assert True is await torch.c("check(['q'])")
    assert await torch.c("queue_pop('q')") == b"one"
    assert await torch.c("queue_pop('q', False)") == b"two"
    with pytest.raises(TorchCallError, match="queue is empty") as error:
        await torch.c("queue_pop('q', False)")
    assert error.value.kind == "QueueEmptyError"
    assert await torch.c("num_keys()") == 0  # queues are not keys, as in torch


async def test_a_blocking_queue_pop_is_woken_by_a_push(
    child: TorchClientProcess, torch: Torch, server: TCPStoreServer
) -> None:
    """A pop on an empty queue waits server-side until another client pushes."""
    popper = TorchClientProcess()
    try:
        await popper(f"connect('p', {server.port})")
        results: list[object] = []
        store = server.store
        assert isinstance(store, ParkingStore)
        async with anyio.create_task_group() as tg:

            async def pop() -> None:
                results.append(await popper("clients['p'].queue_pop('jobs')"))

            tg.start_soon(pop)
            await store.wait_parked(1)
            await torch.c("queue_push('jobs', 'work')")
        assert results == [b"work"]
    finally:
        popper.close()


async def test_several_torch_clients_share_keys(
    child: TorchClientProcess, torch: Torch, server: TCPStoreServer
) -> None:
    """torch's multi-worker test: five clients read a key and compare_set their own."""
    await torch.c("set('key', 'value')")
    for index in range(5):
        await child(f"connect('w{index}', {server.port})")
        assert await torch.c("get('key')", f"w{index}") == b"value"
        await torch.c(f"set('new{index}', 'v{index}')", f"w{index}")
        assert f"next{index}".encode() == await torch.c(
            f"compare_set('new{index}', 'v{index}', 'next{index}')", f"w{index}"
        )


async def test_torch_waiter_woken_by_our_set(torch: Torch, server: TCPStoreServer) -> None:
    """A torch get parked server-side returns when one of our clients sets the key."""
    store = server.store
    assert isinstance(store, ParkingStore)
    results: list[object] = []
    async with TCPStore("127.0.0.1", server.port) as ours, anyio.create_task_group() as tg:

        async def torch_get() -> None:
            results.append(await torch.c("get('shared')"))

        tg.start_soon(torch_get)
        await store.wait_parked(1)
        await ours.set("shared", b"from aioelastic")
    assert results == [b"from aioelastic"]


async def test_our_waiters_woken_by_a_torch_set(torch: Torch, server: TCPStoreServer) -> None:
    """Our get and our change notification both wake on a torch client's set."""
    store = server.store
    assert isinstance(store, ParkingStore)
    async with TCPStore("127.0.0.1", server.port) as ours:
        revision = (await ours.get_prefix("job/")).revision
        got: list[bytes] = []
        changed: list[int] = []
        async with anyio.create_task_group() as tg:

            async def get() -> None:
                got.append(await ours.get("job/k", timeout=60))

            async def change() -> None:
                changed.append(await ours.wait_for_change("job/", after=revision, timeout=60))

            tg.start_soon(get)
            tg.start_soon(change)
            await store.wait_parked(1)
            await torch.c("set('job/k', 'from torch')")
        assert got == [b"from torch"]
        assert changed[0] > revision
        assert await ours.add("job/n", 3) + int(await torch.c("add('job/n', 1)")) == 7  # type: ignore[call-overload]


async def test_one_counter_for_both_kinds_of_client(torch: Torch, server: TCPStoreServer) -> None:
    """Adds from torch and from our client land on one counter; each sees the other's keys."""
    async with TCPStore("127.0.0.1", server.port) as ours:
        assert await ours.add("n", 2) == 2
        assert await torch.c("add('n', 3)") == 5
        assert await ours.add("n", 1) == 6
        await ours.set("ours", b"1")
        assert sorted(await torch.c("list_keys()")) == ["n", "ours"]  # type: ignore[type-var]
        assert await torch.c("num_keys()") == 2


async def test_ttl_keys_expire_for_torch_clients(child: TorchClientProcess) -> None:
    """A key we write with a TTL is seen by torch until it expires on the store's clock."""
    clock = ManualClock()
    async with parking_server(clock=clock) as server, TCPStore("127.0.0.1", server.port) as ours:
        await child(f"connect('t', {server.port})")
        try:
            await ours.set("lease", b"alive", ttl=10)
            assert True is await child("clients['t'].check(['lease'])")
            clock.advance(11)
            assert False is await child("clients['t'].check(['lease'])")
        finally:
            await child("clients.clear()")


async def test_bad_bytes_drop_only_that_connection(
    torch: Torch, server: TCPStoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Undecodable torch bytes close that connection, logged and counted; others go on."""
    with caplog.at_level(logging.WARNING, logger="aioelastic.store.torch"):
        async with await anyio.connect_tcp("127.0.0.1", server.port) as raw:
            await raw.send(VALIDATE + b"\x63")
            with anyio.fail_after(30), pytest.raises(anyio.EndOfStream):
                await raw.receive()
    [record] = [r for r in caplog.records if "unknown torch store command 99" in r.message]
    assert record.levelno == logging.WARNING
    assert server.statistics().dropped_connections == 1
    await torch.c("set('still', 'here')")
    assert await torch.c("get('still')") == b"here"


async def test_a_wrong_magic_number_is_dropped(server: TCPStoreServer) -> None:
    """A connection that opens like torch but without torch's magic number is dropped."""
    async with await anyio.connect_tcp("127.0.0.1", server.port) as raw:
        await raw.send(encode_request(TorchRequest(TorchOp.VALIDATE, (1234,))))
        with anyio.fail_after(30), pytest.raises(anyio.EndOfStream):
            await raw.receive()
    assert server.statistics().dropped_connections == 1


async def test_a_request_before_validate_is_dropped() -> None:
    """On the torch-only listener, the first request must be VALIDATE."""
    async with TorchStoreListener(MemoryStore()) as listener:
        async with await anyio.connect_tcp("127.0.0.1", listener.port) as raw:
            await raw.send(encode_request(TorchRequest(TorchOp.GETNUMKEYS)))
            with anyio.fail_after(30), pytest.raises(anyio.EndOfStream):
                await raw.receive()
        assert listener.statistics().dropped_connections == 1


async def test_add_to_a_non_integer_drops_that_connection(
    torch: Torch, child: TorchClientProcess, server: TCPStoreServer
) -> None:
    """add on a value that is not an integer fails that client (as torch's server does)."""
    await torch.c("set('text', 'abc')")
    await child(f"connect('bad', {server.port})")
    with pytest.raises(TorchCallError):
        await torch.c("add('text', 1)", "bad")
    assert server.statistics().dropped_connections == 1
    assert await torch.c("get('text')") == b"abc"


async def test_a_server_with_a_token_refuses_torch_clients(child: TorchClientProcess) -> None:
    """Torch clients cannot send a token: a token server refuses them unless told otherwise."""
    async with TCPStoreServer(token="secret") as guarded:
        with pytest.raises(TorchCallError):
            await child(f"connect('x', {guarded.port}, timeout=5)")
        assert guarded.statistics().refused_connections >= 1  # torch retries until its timeout
    async with TCPStoreServer(token="secret", torch_clients=True) as opened:
        await child(f"connect('y', {opened.port})")
        await child("clients['y'].set('k', 'v')")
        assert await opened.store.get("k") == b"v"
        await child("clients.clear()")


async def test_init_process_group_through_our_server(
    child: TorchClientProcess, server: TCPStoreServer
) -> None:
    """init_process_group("gloo") with env:// and the agent-store setting runs on our server."""
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(server.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    await child(f"__import__('os').environ.update({env!r})")
    await child("dist.init_process_group('gloo', init_method='env://')")
    try:
        assert await child("dist.get_world_size()") == 1
        await child("dist.barrier()")
    finally:
        await child("dist.destroy_process_group()")
    snapshot = await server.store.get_prefix("")
    assert any(key.startswith("default_pg/") for key in snapshot.items)


async def test_listener_serves_torch_over_any_store(child: TorchClientProcess) -> None:
    """The torch-only listener relays to the store it is given (here a prefix of another)."""
    async with MemoryStore() as inner:
        async with TorchStoreListener(PrefixStore("job", inner)) as listener:
            await child(f"connect('l', {listener.port})")
            try:
                await child("clients['l'].set('k', 'v')")
                assert await child("clients['l'].add('n', 1)") == 1
                assert listener.statistics().connections == 1
            finally:
                await child("clients.clear()")
        assert await inner.get("job/k") == b"v"


def test_listener_refuses_a_network_address_unless_exposed() -> None:
    """Torch clients cannot authenticate: serving them beyond loopback needs expose=True."""
    with pytest.raises(ValueError, match=r"refusing to serve torch's store protocol on 0\.0\.0\.0"):
        TorchStoreListener(MemoryStore(), "0.0.0.0")
    assert TorchStoreListener(MemoryStore(), "0.0.0.0", expose=True).host == "0.0.0.0"


async def test_the_torch_clients_example_runs() -> None:
    """examples/store_torch_clients.py: torch and our client share one port and one keyspace."""
    example = Path(__file__).parents[2] / "examples" / "store_torch_clients.py"
    with anyio.fail_after(120):
        done = await anyio.run_process([sys.executable, str(example)])
    assert done.stdout.decode().splitlines() == [
        "torch read b'hello'",
        "ours read b'hello'",
        "counter 3",
    ]


async def _read_exactly(stream: anyio.abc.SocketStream, size: int) -> bytes:
    received = b""
    with anyio.fail_after(30):
        while len(received) < size:
            received += await stream.receive()
    return received


def _torch_bytes(*requests: TorchRequest) -> bytes:
    return b"".join(encode_request(request) for request in requests)


@pytest.mark.parametrize("front", ["server", "listener"])
async def test_pipelined_replies_keep_request_order_across_a_wait(front: str) -> None:
    """Requests behind a parked WAIT are answered after it, in order; CANCEL_WAIT withdraws it."""
    async with MemoryStore() as store, contextlib.AsyncExitStack() as stack:
        if front == "server":
            server = await stack.enter_async_context(TCPStoreServer())
            store, port = server.store, server.port
        else:
            port = (await stack.enter_async_context(TorchStoreListener(store))).port
        raw = await stack.enter_async_context(await anyio.connect_tcp("127.0.0.1", port))
        await raw.send(
            VALIDATE
            + _torch_bytes(
                TorchRequest(TorchOp.SET, ("/k", b"v")),
                TorchRequest(TorchOp.WAIT, (["/x"],)),
                TorchRequest(TorchOp.GET, ("/k",)),
                TorchRequest(TorchOp.PING, (5,)),
            )
        )
        await store.set("x", b"now")  # wakes the WAIT; the GET and PING answers follow it
        expected = b"\x00" + struct.pack("<Q", 1) + b"v" + struct.pack("<I", 5)
        assert await _read_exactly(raw, len(expected)) == expected
        await raw.send(
            _torch_bytes(
                TorchRequest(TorchOp.WAIT, (["/never"],)),
                TorchRequest(TorchOp.CANCEL_WAIT),
                TorchRequest(TorchOp.PING, (6,)),
            )
        )
        expected = b"\x01" + struct.pack("<I", 6)  # WAIT_CANCELED, no STOP_WAITING
        assert await _read_exactly(raw, len(expected)) == expected
