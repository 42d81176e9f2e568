"""The TCP store server against real sockets: bad input, tokens, waits held server-side."""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from aioelastic.store import (
    StoreProtocolError,
    StoreRefusedError,
    StoreValueError,
    TCPStore,
    TCPStoreServer,
)
from aioelastic.store._tcp_codec import (
    VERSION,
    FrameReader,
    Op,
    Reply,
    Status,
    decode_reply,
    encode_preamble,
    encode_request,
)
from aioelastic.store._torch_codec import TorchOp, TorchRequest
from aioelastic.store._torch_codec import encode_request as encode_torch
from aioelastic.testing import ManualClock
from tests.store.conftest import Parked

pytestmark = pytest.mark.anyio


class RawClient:
    """A hand-driven connection that can send any bytes and read replies."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self.pending: list[bytes] = []

    async def reply(self) -> Reply:
        with anyio.fail_after(10):
            while not self.pending:
                self.pending += self.reader.feed(await self.stream.receive())
        return decode_reply(self.pending.pop(0))

    async def closed_by_server(self) -> bool:
        """Return True once the server closed the connection (reading any bytes still sent)."""
        with anyio.fail_after(10):
            try:
                while True:
                    await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return True


class RawClients:
    """Opens raw connections and closes them all at the end of the test."""

    def __init__(self) -> None:
        self.clients: list[RawClient] = []

    async def connect(self, server: TCPStoreServer, *, hello: bool = True) -> RawClient:
        client = RawClient(await anyio.connect_tcp("127.0.0.1", server.port))
        self.clients.append(client)
        if hello:
            await client.stream.send(encode_preamble() + encode_request(Op.HELLO, 0, b""))
            assert (await client.reply()).status is Status.WELCOME
        return client


@pytest.fixture
async def raw() -> AsyncIterator[RawClients]:
    clients = RawClients()
    yield clients
    for client in clients.clients:
        await client.stream.aclose()


async def still_serves(server: TCPStoreServer) -> None:
    """A fresh client can write and read: the server survived whatever came before."""
    async with TCPStore("127.0.0.1", server.port) as store:
        await store.set("alive", b"yes")
        assert await store.get("alive") == b"yes"


async def test_foreign_client_is_dropped_and_logged_once(
    raw: RawClients, tcp_server: TCPStoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A client speaking another protocol is closed with one warning; others are served."""
    client = await raw.connect(tcp_server, hello=False)
    with caplog.at_level(logging.WARNING, logger="aioelastic.store.tcp"):
        await client.stream.send(b"GET / HTTP/1.1\r\n\r\n")
        assert await client.closed_by_server()
    [record] = [r for r in caplog.records if "not an aioelastic store client" in r.message]
    assert record.levelno == logging.WARNING
    assert tcp_server.statistics().dropped_connections == 1
    await still_serves(tcp_server)


async def test_oversized_frame_drops_only_that_connection(
    raw: RawClients, clock: ManualClock
) -> None:
    """A frame above the limit closes its connection; other clients keep their waits."""
    async with TCPStoreServer(clock=clock, max_frame_size=1000) as server:
        async with TCPStore("127.0.0.1", server.port) as store, anyio.create_task_group() as tg:
            parked = Parked(clock)
            results: list[bytes] = []

            async def getter() -> None:
                results.append(await store.get("k"))

            tg.start_soon(getter)
            await parked.wait()
            bad = await raw.connect(server)
            await bad.stream.send(struct.pack(">I", 5000) + b"x" * 100)
            assert await bad.closed_by_server()
            await store.set("k", b"v")
        assert results == [b"v"]
        assert server.statistics().dropped_connections == 1


async def test_unknown_operation_is_refused_and_the_connection_goes_on(
    raw: RawClients,
    tcp_server: TCPStoreServer,
) -> None:
    """An unknown op gets BAD_REQUEST for its id; the next request on the same connection works."""
    client = await raw.connect(tcp_server)
    await client.stream.send(struct.pack(">IBI", 5, 99, 41) + encode_request(Op.NUM_KEYS, 42))
    refused, answered = await client.reply(), await client.reply()
    assert (refused.status, refused.request_id) == (Status.BAD_REQUEST, 41)
    assert refused.fields == ("unknown operation 99",)
    assert (answered.status, answered.request_id, answered.fields) == (Status.INT, 42, (0,))
    assert tcp_server.statistics().bad_requests == 1


async def test_malformed_fields_are_refused_for_that_request_only(
    raw: RawClients,
    tcp_server: TCPStoreServer,
) -> None:
    """A request whose fields do not decode is refused; the connection keeps working."""
    client = await raw.connect(tcp_server)
    truncated = encode_request(Op.SET, 5, "k", b"v", None)[:-1]
    truncated = struct.pack(">I", len(truncated) - 4) + truncated[4:]
    await client.stream.send(truncated + encode_request(Op.CHECK, 6, ["k"]))
    refused, answered = await client.reply(), await client.reply()
    assert (refused.status, refused.request_id) == (Status.BAD_REQUEST, 5)
    assert "frame ends inside an optional float" in str(refused.fields[0])
    assert (answered.request_id, answered.fields) == (6, (False,))


async def test_client_sees_bad_request_as_protocol_error(tcp_server: TCPStoreServer) -> None:
    """A second HELLO is refused and the client raises StoreProtocolError saying so."""
    async with TCPStore("127.0.0.1", tcp_server.port) as store:
        with pytest.raises(StoreProtocolError, match="HELLO was already sent"):
            await store._call(Op.HELLO, "", b"")
        assert await store.num_keys() == 0


async def test_invalid_arguments_come_back_as_value_errors(
    raw: RawClients, tcp_server: TCPStoreServer
) -> None:
    """A request the store refuses (negative ttl sent raw) is a ValueError on the client."""
    client = await raw.connect(tcp_server)
    await client.stream.send(encode_request(Op.SET, 9, "k", b"v", -1.0))
    reply = await client.reply()
    assert reply.status is Status.INVALID
    assert "ttl must be a positive, finite number of seconds, not -1.0" in str(reply.fields[0])


async def test_silent_client_is_dropped_after_the_handshake_timeout(
    raw: RawClients,
) -> None:
    """A connection that never sends its preamble is closed after handshake_timeout."""
    async with TCPStoreServer(handshake_timeout=0.05) as server:
        client = await raw.connect(server, hello=False)
        assert await client.closed_by_server()
        assert server.statistics().dropped_connections == 1


@pytest.mark.parametrize(
    ("offered", "message"),
    [
        (None, "this server requires a token"),
        ("wrong", "the token does not match"),
    ],
)
async def test_client_without_the_token_is_refused(offered: str | None, message: str) -> None:
    """A missing or wrong token is refused with a clear error, and not retried."""
    async with TCPStoreServer(token="s3cret") as server:
        with pytest.raises(StoreRefusedError, match=f"refused the connection: {message}"):
            async with TCPStore("127.0.0.1", server.port, token=offered):
                pass
        assert server.statistics().refused_connections == 1


async def test_client_with_the_token_is_served() -> None:
    """The right token opens the store."""
    async with (
        TCPStoreServer(token=b"s3cret") as server,
        TCPStore("127.0.0.1", server.port, token="s3cret") as store,
    ):
        await store.set("k", b"v")
        assert await store.get("k") == b"v"


async def test_protocol_version_mismatch_is_refused(
    raw: RawClients, tcp_server: TCPStoreServer
) -> None:
    """A client announcing another version is refused with both versions named."""
    client = await raw.connect(tcp_server, hello=False)
    other = VERSION + 1
    await client.stream.send(encode_preamble(version=other) + encode_request(Op.HELLO, 0, b""))
    reply = await client.reply()
    assert reply.status is Status.REFUSED
    expected = f"client speaks store protocol version {other}, the server {VERSION}"
    assert expected in str(reply.fields[0])


async def test_disconnecting_waiter_is_withdrawn(
    raw: RawClients, tcp_server: TCPStoreServer, clock: ManualClock
) -> None:
    """A client that disconnects while its get waits leaves no waiter behind."""
    parked = Parked(clock)
    client = await raw.connect(tcp_server)
    await client.stream.send(encode_request(Op.GET, 1, "never", 100.0))
    await parked.wait()
    assert tcp_server.statistics().waiting_requests == 1
    await client.stream.aclose()
    with anyio.fail_after(10):
        while tcp_server.statistics().waiting_requests:
            await anyio.wait_all_tasks_blocked()
    assert tcp_server.store.statistics().key_waiters == 0


async def test_cancelled_call_withdraws_its_server_side_wait(
    tcp_server: TCPStoreServer, tcp_store: TCPStore, clock: ManualClock
) -> None:
    """Cancelling a waiting get on the client sends CANCEL; the server drops the wait."""
    parked = Parked(clock)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tcp_store.get, "never")
            await parked.wait()
            scope.cancel()
    with anyio.fail_after(10):
        while tcp_server.statistics().waiting_requests:
            await anyio.wait_all_tasks_blocked()
    assert tcp_server.store.statistics().key_waiters == 0
    assert await tcp_store.num_keys() == 0


async def test_thousand_idle_connections_do_not_stop_service(
    raw: RawClients, tcp_server: TCPStoreServer
) -> None:
    """With 1,000 idle handshaken connections open, a new client is served normally."""
    for _ in range(1000):
        await raw.connect(tcp_server)
    assert tcp_server.statistics().connections == 1000
    await still_serves(tcp_server)


async def test_server_reports_its_port_only_once_listening() -> None:
    """Asking for the port before serving is a clear misuse error."""
    server = TCPStoreServer()
    with pytest.raises(RuntimeError, match="not listening yet"):
        _ = server.port
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        assert port == server.port
        tg.cancel_scope.cancel()


async def test_client_learns_a_smaller_server_frame_limit() -> None:
    """A value over the server's (smaller) frame limit is refused by the client, never sent."""
    async with (
        TCPStoreServer(max_frame_size=1000) as server,
        TCPStore("127.0.0.1", server.port) as store,
    ):
        with pytest.raises(StoreValueError, match="exceeds the maximum frame size of 1000"):
            await store.set("k", b"x" * 1000)
        await store.set("k", b"x" * 900)
        assert server.statistics().dropped_connections == 0


async def test_reply_over_the_frame_limit_is_a_clear_error() -> None:
    """A get_prefix whose reply exceeds the frame limit raises; the connection keeps serving."""
    async with (
        TCPStoreServer(max_frame_size=1000) as server,
        TCPStore("127.0.0.1", server.port) as store,
    ):
        server.store.multi_set_nowait(["big/a", "big/b"], [b"x" * 600, b"y" * 600])
        with pytest.raises(StoreValueError, match=r"reply to get_prefix would be a frame of \d+"):
            await store.get_prefix("big/")
        assert (await store.get_prefix("big/a")).items == {"big/a": b"x" * 600}
        stats = server.statistics()
    assert (stats.dropped_connections, stats.connections_total) == (0, 1)


async def test_waiting_reply_over_the_frame_limit_is_a_clear_error(clock: ManualClock) -> None:
    """A parked multi_get whose values outgrow the frame limit raises once they arrive."""
    async with (
        TCPStoreServer(max_frame_size=1000, clock=clock) as server,
        TCPStore("127.0.0.1", server.port) as store,
        anyio.create_task_group() as tg,
    ):
        errors: list[StoreValueError] = []

        async def multi_get() -> None:
            with pytest.raises(StoreValueError, match="reply to multi_get would be") as caught:
                await store.multi_get(["a", "b"])
            errors.append(caught.value)

        parked = Parked(clock)
        tg.start_soon(multi_get)
        await parked.wait()
        server.store.multi_set_nowait(["a", "b"], [b"x" * 600, b"y" * 600])
    assert len(errors) == 1


async def test_reply_over_the_client_frame_limit_fails_only_that_call() -> None:
    """A reply above a client's own smaller limit fails that call once; later calls succeed."""
    async with (
        TCPStoreServer() as server,
        TCPStore("127.0.0.1", server.port, max_frame_size=1000) as store,
    ):
        server.store.set_nowait("big", b"x" * 2000)
        with pytest.raises(StoreValueError, match=r"reply to get\('big'\) could not be read: a"):
            await store.get("big")
        await store.set("small", b"1")
        assert await store.get("small") == b"1"


async def test_torch_protocol_is_served_on_the_same_port(tcp_server: TCPStoreServer) -> None:
    """A connection opening with torch's VALIDATE speaks torch's protocol, on every loop."""
    requests = [
        TorchRequest(TorchOp.VALIDATE, (0x3C85F7CE,)),
        TorchRequest(TorchOp.PING, (7,)),
        TorchRequest(TorchOp.SET, ("/k", b"v")),
        TorchRequest(TorchOp.GET, ("/k",)),
    ]
    async with await anyio.connect_tcp("127.0.0.1", tcp_server.port) as raw:
        await raw.send(b"".join(encode_torch(request) for request in requests))
        expected = struct.pack("<I", 7) + struct.pack("<Q", 1) + b"v"
        received = b""
        with anyio.fail_after(10):
            while len(received) < len(expected):
                received += await raw.receive()
    assert expected == received
    assert await tcp_server.store.get("k") == b"v"
    assert tcp_server.statistics().torch_connections_total == 1
