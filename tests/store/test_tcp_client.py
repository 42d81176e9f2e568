"""The TCP store client when connections drop, replies are lost or the server restarts."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from aioelastic.store import (
    StoreClosedError,
    StoreConnectionError,
    StoreOutcomeUnknownError,
    StoreProtocolError,
    StoreServerGone,
    TCPStore,
    TCPStoreServer,
)
from aioelastic.store._tcp_client import refused
from aioelastic.store._tcp_codec import (
    PREAMBLE_SIZE,
    FrameReader,
    Op,
    Request,
    Status,
    decode_request,
    encode_reply,
)
from aioelastic.testing import ManualClock
from tests.store.conftest import Parked

pytestmark = pytest.mark.anyio

_STREAM_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class Proxy:
    """A real TCP relay between clients and a server, which a test can cut or make lossy."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.drop_replies = False
        self.links: list[tuple[anyio.abc.SocketStream, anyio.abc.SocketStream]] = []
        self.frozen: set[int] = set()  # ids of the client streams relayed no more, either way

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._relay)

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", self.target_port) as upstream:
            self.links.append((client, upstream))
            async with anyio.create_task_group() as tg:

                async def pump(
                    source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, replies: bool
                ) -> None:
                    try:
                        async for chunk in source:
                            if id(client) in self.frozen:
                                continue
                            if not (replies and self.drop_replies):
                                await sink.send(chunk)
                    except _STREAM_ERRORS:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(pump, client, upstream, False)
                tg.start_soon(pump, upstream, client, True)

    def freeze(self) -> None:
        """Stop relaying the open connections, both ways, without closing them: a silent
        partition (new connections are relayed)."""
        self.frozen |= {id(client) for client, _ in self.links}

    async def cut(self) -> None:
        """Close every relayed connection, as a network failure would."""
        links, self.links = self.links, []
        for client, upstream in links:
            await anyio.aclose_forcefully(client)
            await anyio.aclose_forcefully(upstream)


@pytest.fixture
async def proxy(tcp_server: TCPStoreServer) -> AsyncIterator[Proxy]:
    proxy = Proxy(tcp_server.port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        yield proxy
        tg.cancel_scope.cancel()


async def until(condition: object) -> None:
    """Let tasks and I/O run until ``condition()`` holds (bounded generously)."""
    assert callable(condition)
    with anyio.fail_after(10):
        while not condition():
            await anyio.wait_all_tasks_blocked()


class Running:
    """A server serving in a test's task group, which the test can stop mid-way."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()

    @classmethod
    async def start(cls, tg: anyio.abc.TaskGroup, server: TCPStoreServer) -> Running:
        running = cls()

        async def serve(*, task_status: anyio.abc.TaskStatus[int]) -> None:
            with running.scope:
                await server.serve(task_status=task_status)
            running.stopped.set()

        await tg.start(serve)
        return running

    async def stop(self) -> None:
        """Stop the server and return once its port and connections are closed."""
        self.scope.cancel()
        await self.stopped.wait()


async def park_failing_get(
    tg: anyio.abc.TaskGroup,
    store: TCPStore,
    clock: ManualClock,
    errors: list[StoreConnectionError],
) -> None:
    """Start a get that collects its StoreConnectionError; return once it waits server-side."""

    async def getter() -> None:
        try:
            await store.get("k")
        except StoreConnectionError as error:
            errors.append(error)

    parked = Parked(clock)
    tg.start_soon(getter)
    await parked.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_waiting_get_is_resent_after_a_dropped_connection(
    tcp_server: TCPStoreServer, proxy: Proxy, clock: ManualClock
) -> None:
    """A get waiting when the connection drops is re-sent on the new one and still returns."""
    parked = Parked(clock)
    async with TCPStore("127.0.0.1", proxy.port) as store, anyio.create_task_group() as tg:
        results: list[bytes] = []

        async def getter() -> None:
            results.append(await store.get("k"))

        tg.start_soon(getter)
        await parked.wait()
        await proxy.cut()
        await parked.wait(2)
        tcp_server.store.set_nowait("k", b"after the cut")
    assert results == [b"after the cut"]
    assert tcp_server.statistics().connections_total == 2


async def test_a_connection_that_stops_answering_is_replaced(
    tcp_server: TCPStoreServer, proxy: Proxy, clock: ManualClock
) -> None:
    """With request_timeout, a call left unanswered replaces the connection (an add says its
    outcome is unknown), and a wait held on the silent connection moves to the new one."""
    parked = Parked(clock)
    async with (
        TCPStore("127.0.0.1", proxy.port, request_timeout=0.5) as store,
        anyio.create_task_group() as tg,
    ):
        results: list[bytes] = []

        async def getter() -> None:
            results.append(await store.get("k"))

        tg.start_soon(getter)
        await parked.wait()
        proxy.freeze()
        with pytest.raises(StoreOutcomeUnknownError, match=r"add\('n'\)"):
            await store.add("n", 1)
        await parked.wait(2)  # the get, re-sent on the new connection, waits there
        tcp_server.store.set_nowait("k", b"after the heal")
        assert tcp_server.store.get_nowait(["n"]) is None  # the frozen link delivered nothing
    assert results == [b"after the heal"]
    assert tcp_server.statistics().connections_total == 2


async def test_add_whose_reply_is_lost_is_never_resent(
    tcp_server: TCPStoreServer, proxy: Proxy
) -> None:
    """An add applied by the server but whose reply was lost raises, and is applied once."""
    async with TCPStore("127.0.0.1", proxy.port) as store, anyio.create_task_group() as tg:
        errors: list[StoreConnectionError] = []

        async def adder() -> None:
            try:
                await store.add("n", 1)
            except StoreOutcomeUnknownError as error:
                errors.append(error)

        proxy.drop_replies = True
        tg.start_soon(adder)
        await until(lambda: tcp_server.statistics().requests == 1)
        proxy.drop_replies = False
        await proxy.cut()
    [error] = errors
    assert "lost before the reply to add('n')" in str(error)
    assert "was not re-sent: read the key to find out" in str(error)
    async with TCPStore("127.0.0.1", proxy.port) as store:
        assert await store.get("n") == b"1"


async def test_server_restart_fails_pending_calls_then_serves(clock: ManualClock) -> None:
    """After a restart (keys lost), a pending wait fails clearly; later calls use the new server."""
    errors: list[StoreConnectionError] = []
    first = TCPStoreServer(clock=clock)
    async with anyio.create_task_group() as tg:
        first_running = await Running.start(tg, first)
        async with TCPStore("127.0.0.1", first.port) as store, anyio.create_task_group() as calls:
            await park_failing_get(calls, store, clock, errors)
            await first_running.stop()
            async with TCPStoreServer(port=first.port, clock=clock) as second:
                await store.set("k", b"new server")
                assert second.store.get_nowait(["k"]) == [b"new server"]
    [error] = errors
    assert "the server restarted and lost its keys while this call was waiting" in str(error)


async def test_unreachable_server_fails_after_connect_timeout() -> None:
    """Connecting to a port nobody listens on fails with the timeout and what to check."""
    port = free_port()
    with pytest.raises(StoreConnectionError, match=r"could not connect within 0.2 s \(last error"):
        async with TCPStore("127.0.0.1", port, connect_timeout=0.2):
            pass


async def test_pending_call_fails_when_the_server_never_comes_back(clock: ManualClock) -> None:
    """A waiting get fails with StoreConnectionError once reconnecting has taken too long."""
    errors: list[StoreConnectionError] = []
    server = TCPStoreServer(clock=clock)
    async with anyio.create_task_group() as tg:
        running = await Running.start(tg, server)
        store = TCPStore("127.0.0.1", server.port, connect_timeout=0.2)
        async with store, anyio.create_task_group() as calls:
            await park_failing_get(calls, store, clock, errors)
            await running.stop()
    [error] = errors
    assert "could not connect within 0.2 s" in str(error)


async def test_calls_after_close_are_refused(tcp_store: TCPStore) -> None:
    """A closed client raises StoreClosedError instead of hanging."""
    await tcp_store.aclose()
    with pytest.raises(StoreClosedError, match="is not open"):
        await tcp_store.get("k")


async def test_concurrent_requests_share_one_connection(
    tcp_server: TCPStoreServer, tcp_store: TCPStore
) -> None:
    """Two hundred concurrent adds on one client all apply, over a single connection."""
    async with anyio.create_task_group() as tg:
        for _ in range(200):
            tg.start_soon(tcp_store.add, "n", 1)
    assert await tcp_store.get("n") == b"200"
    assert tcp_server.statistics().connections_total == 1


async def test_calls_fail_at_once_while_the_server_stays_unreachable(clock: ManualClock) -> None:
    """Once reconnecting outlasted connect_timeout, a new call fails at once with the reason."""
    errors: list[StoreConnectionError] = []
    server = TCPStoreServer(clock=clock)
    async with anyio.create_task_group() as tg:
        running = await Running.start(tg, server)
        async with TCPStore("127.0.0.1", server.port, connect_timeout=0.2) as store:
            async with anyio.create_task_group() as calls:
                await park_failing_get(calls, store, clock, errors)
                await running.stop()
            with pytest.raises(StoreConnectionError, match="still retrying in the background"):
                await store.set("k", b"v")
    assert len(errors) == 1


async def test_malformed_reply_fails_only_its_call() -> None:
    """A reply that does not decode fails its call with StoreProtocolError, not a re-send loop."""
    requests: list[Request] = []

    async def serve(stream: anyio.abc.SocketStream) -> None:
        reader = FrameReader()
        async with stream:
            preamble = b""
            while len(preamble) < PREAMBLE_SIZE:
                preamble += await stream.receive(PREAMBLE_SIZE - len(preamble))
            async for chunk in stream:
                for body in reader.feed(chunk):
                    request = decode_request(body)
                    requests.append(request)
                    if request.op is Op.HELLO:
                        await stream.send(encode_reply(Status.WELCOME, 0, 1, 1 << 20, b""))
                    else:  # an INT reply whose integer is not decimal
                        bad = encode_reply(Status.BYTES, request.request_id, b"x")
                        await stream.send(bad[:4] + bytes([Status.INT]) + bad[5:])

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        async with TCPStore("127.0.0.1", port, timeout=30) as store:
            with pytest.raises(StoreProtocolError, match=r"reply to add\('n'\) could not be read"):
                await store.add("n", 1)
        tg.cancel_scope.cancel()
    assert [request.op for request in requests].count(Op.ADD) == 1


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (ConnectionResetError(104, "reset"), True),
        (
            OSError("Multiple exceptions: [Errno 111] Connect call failed, [Errno 111] Connect"),
            True,
        ),
        (
            OSError("Multiple exceptions: [Errno 111] Connect call failed, [Errno 113] no route"),
            False,
        ),
        (TimeoutError(), False),
        (OSError(113, "No route to host"), False),
    ],
)
def test_a_server_is_gone_only_when_every_address_refused(error: OSError, gone: bool) -> None:
    """Refused or reset on every address means nothing listens; a timeout or no route may be
    a partition."""
    assert refused(error) is gone


def test_anyios_all_attempts_failed_is_judged_by_its_causes() -> None:
    """anyio (trio's connect) reports one error per address as the cause of its own."""
    every = OSError("All connection attempts failed")
    every.__cause__ = ExceptionGroup(
        "x", [ConnectionRefusedError(111, "a"), ConnectionRefusedError(111, "b")]
    )
    mixed = OSError("All connection attempts failed")
    mixed.__cause__ = ExceptionGroup("x", [ConnectionRefusedError(111, "a"), TimeoutError()])
    assert (refused(every), refused(mixed)) == (True, False)


async def test_a_stopped_server_is_reported_gone_then_back(clock: ManualClock) -> None:
    """The server stops: the client says it is gone (once, with the refusal); a server back on
    the port clears it once the client reconnects."""
    events: list[StoreServerGone] = []
    server = TCPStoreServer(clock=clock)
    async with anyio.create_task_group() as tg:
        running = await Running.start(tg, server)
        async with TCPStore("127.0.0.1", server.port, connect_timeout=60) as store:
            told = anyio.Event()
            store.subscribe(lambda event: (events.append(event), told.set()))
            assert store.server_gone is None
            await running.stop()
            with anyio.fail_after(10):  # generous: the first reconnection is refused at once
                await told.wait()
            assert store.server_gone is not None
            assert "is gone: reconnecting was refused" in store.server_gone
            async with TCPStoreServer(port=server.port, clock=clock):
                await store.set("k", b"v")
                assert store.server_gone is None
                assert [event.endpoint for event in events] == [store.endpoint]
