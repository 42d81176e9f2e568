"""The blocking client against a real server, a relaying listener, and servers that misbehave.

The conformance suite (``test_conformance.py``, backend ``blocking``) checks each operation's
semantics; these check what is particular to a blocking client: its errors, its timeouts, a
server that dies or talks nonsense, views over one connection, closing from another thread.
Servers run in a thread of their own (an event loop in a blocking portal), so the client's
blocking calls block only the test's thread.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from aioelastic.store import (
    BlockingTCPStore,
    MemoryStore,
    PrefixStore,
    StoreClosedError,
    StoreConnectionError,
    StoreOutcomeUnknownError,
    StoreProtocolError,
    StoreRefusedError,
    StoreTimeoutError,
    StoreValueError,
    TCPStore,
    TCPStoreServer,
    TorchStoreListener,
)
from aioelastic.store._tcp_codec import (
    PREAMBLE_SIZE,
    FrameReader,
    Status,
    decode_request,
    encode_reply,
)


class Served:
    """A :class:`TCPStoreServer` (or another service) running in a portal's thread until
    :meth:`stop`."""

    def __init__(self, portal: BlockingPortal, service: object) -> None:
        self.portal = portal
        self.stack = contextlib.ExitStack()
        self.service = self.stack.enter_context(portal.wrap_async_context_manager(service))  # type: ignore[arg-type]

    @property
    def port(self) -> int:
        port: int = self.service.port
        return port

    def stop(self) -> None:
        self.stack.close()


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


@pytest.fixture
def served(portal: BlockingPortal) -> Iterator[Served]:
    server = Served(portal, TCPStoreServer())
    yield server
    server.stop()


@pytest.fixture
def client(served: Served) -> Iterator[BlockingTCPStore]:
    with BlockingTCPStore("127.0.0.1", served.port, timeout=30) as store:
        yield store


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def fake_server(script: Callable[[socket.socket], None], *, hold: bool = True) -> Iterator[int]:
    """A server in a thread: ``script`` gets each accepted socket, which stays open until the
    test is done (closed at once with ``hold=False``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def run() -> None:
        with contextlib.suppress(OSError):
            while not done.is_set():
                connection, _ = listener.accept()
                with connection:
                    script(connection)
                    if hold:
                        done.wait(30)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        thread.join(30)


def welcome(connection: socket.socket) -> FrameReader:
    """Play the server's side of a token-less handshake; return the reader of what follows."""
    data = b""
    while len(data) < PREAMBLE_SIZE + 9:
        data += connection.recv(4096)
    connection.sendall(encode_reply(Status.WELCOME, 0, 7, 1 << 20, b""))
    return FrameReader()


def next_request(connection: socket.socket, reader: FrameReader) -> int:
    """Read one request; return its id."""
    while True:
        bodies = reader.feed(connection.recv(4096))
        if bodies:
            return decode_request(bodies[0]).request_id


# -- it works ----------------------------------------------------------------------------------


def test_calls_reach_the_server_and_its_async_clients(
    portal: BlockingPortal, served: Served, client: BlockingTCPStore
) -> None:
    """What the blocking client writes, an async client of the same server reads."""
    client.set("k", b"v")
    assert client.add("n", 2) == 2

    async def read() -> tuple[bytes, bytes]:
        async with TCPStore("127.0.0.1", served.port) as other:
            return await other.get("k"), await other.get("n")

    assert portal.call(read) == (b"v", b"2")


def test_a_view_prefixes_its_keys_and_shares_the_connection(client: BlockingTCPStore) -> None:
    """scoped() writes under prefix/; closing the view leaves the client usable."""
    view = client.scoped("gen3")
    view.set("rank0", b"a")
    assert client.get("gen3/rank0") == b"a"
    assert view.get_prefix("").items == {"rank0": b"a"}
    assert view.num_keys() == 1
    assert view.scoped("inner").endpoint.endswith("under 'gen3/inner/'")
    view.close()
    with pytest.raises(StoreClosedError):
        view.get("rank0")
    assert client.get("gen3/rank0") == b"a"
    assert client.usable


def test_a_timeout_in_a_view_names_the_callers_key(client: BlockingTCPStore) -> None:
    """A server-side timeout raises StoreTimeoutError naming the key without the prefix."""
    view = client.scoped("gen1")
    with pytest.raises(StoreTimeoutError, match="after 0 s waiting for 'absent'") as caught:
        view.get("absent", timeout=0)
    assert caught.value.keys == ("absent",)
    assert client.usable


def test_a_value_above_the_frame_limit_is_refused_before_sending(served: Served) -> None:
    """A frame larger than the negotiated limit raises StoreValueError; the client goes on."""
    with BlockingTCPStore("127.0.0.1", served.port, max_frame_size=1024) as small:
        with pytest.raises(StoreValueError, match="exceeds the maximum frame size of 1024"):
            small.set("big", b"x" * 2000)
        small.set("fine", b"x")
        assert small.get("fine") == b"x"


def test_a_token_is_proved_and_a_missing_one_refused(portal: BlockingPortal) -> None:
    """A server with a token lets in the client holding it and refuses one without."""
    server = Served(portal, TCPStoreServer(token="sixteen-byte-secret"))
    try:
        with BlockingTCPStore("127.0.0.1", server.port, token="sixteen-byte-secret") as ok:
            ok.set("k", b"v")
        with pytest.raises(StoreRefusedError, match="requires a token"):
            BlockingTCPStore("127.0.0.1", server.port)
        with pytest.raises(StoreRefusedError, match="token does not match"):
            BlockingTCPStore("127.0.0.1", server.port, token="another-long-secret")
    finally:
        server.stop()


# -- a dead or wrong server --------------------------------------------------------------------


def test_nothing_listening_is_a_connection_error() -> None:
    """No server at the address: StoreConnectionError once connect_timeout passed."""
    port = free_port()
    with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{port}.*could not connect within"):
        BlockingTCPStore("127.0.0.1", port, connect_timeout=0.3)


def test_a_server_that_hangs_up_at_once_is_named_as_not_ours() -> None:
    """A server closing every connection (as torch's does with our preamble) is reported so."""
    with (
        fake_server(lambda connection: None, hold=False) as port,
        pytest.raises(StoreConnectionError, match="is it an aioelastic store"),
    ):
        BlockingTCPStore("127.0.0.1", port, connect_timeout=0.3)


def test_garbage_instead_of_a_handshake_is_a_protocol_error() -> None:
    """A server answering with another protocol raises StoreProtocolError at once."""

    def http(connection: socket.socket) -> None:
        connection.recv(4096)
        connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    with (
        fake_server(http) as port,
        pytest.raises(StoreProtocolError, match="not an aioelastic store's handshake"),
    ):
        BlockingTCPStore("127.0.0.1", port)


@pytest.mark.torch
def test_torchs_own_server_is_not_mistaken_for_ours() -> None:
    """Against torch's TCPStore server the client says it is not an aioelastic store."""
    pytest.importorskip("torch")
    code = (
        "import torch.distributed as d, sys; "
        "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); "
        "print(s.port, flush=True); sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as torch_server:
        assert torch_server.stdout is not None
        port = int(torch_server.stdout.readline())
        try:
            with pytest.raises(StoreConnectionError, match="is it an aioelastic store"):
                BlockingTCPStore("127.0.0.1", port, connect_timeout=0.5)
        finally:
            assert torch_server.stdin is not None
            torch_server.stdin.close()


def test_a_server_that_dies_breaks_the_client(served: Served, client: BlockingTCPStore) -> None:
    """The server stops: the call raises, and every later call names the first cause."""
    client.set("k", b"v")
    served.stop()
    with pytest.raises(StoreConnectionError, match="the server closed the connection"):
        client.get("k")
    assert not client.usable
    with pytest.raises(StoreConnectionError, match=r"broke earlier .*open a new client"):
        client.set("k", b"again")


def test_a_closed_connection_is_seen_without_a_call(
    served: Served, client: BlockingTCPStore
) -> None:
    """usable turns False once the server is gone, before any call fails."""
    assert client.usable
    served.stop()
    with pytest.raises(StoreConnectionError):
        client.check(["k"])  # the server's close may take a moment to arrive; a call sees it
    assert not client.usable


def test_a_change_whose_reply_is_lost_has_an_unknown_outcome() -> None:
    """The server takes an add and hangs up: StoreOutcomeUnknownError, not a plain error."""

    def take_and_hang_up(connection: socket.socket) -> None:
        next_request(connection, welcome(connection))
        connection.shutdown(socket.SHUT_RDWR)

    with (
        fake_server(take_and_hang_up) as port,
        BlockingTCPStore("127.0.0.1", port) as store,
        pytest.raises(StoreOutcomeUnknownError, match=r"add\('n'\).*may or may not"),
    ):
        store.add("n", 1)


def test_garbage_after_the_handshake_breaks_the_client() -> None:
    """A reply frame that does not decode raises StoreConnectionError and breaks the client."""

    def garbage(connection: socket.socket) -> None:
        next_request(connection, welcome(connection))
        connection.sendall(b"\x00\x00\x00\x05\xff\x00\x00\x00\x01")

    with fake_server(garbage) as port, BlockingTCPStore("127.0.0.1", port) as store:
        with pytest.raises(StoreConnectionError, match="bad reply: unknown reply status 255"):
            store.get("k")
        assert not store.usable


def test_a_server_that_never_answers_times_out() -> None:
    """No reply within the client's timeout: StoreConnectionError naming the call."""

    def silent(connection: socket.socket) -> None:
        next_request(connection, welcome(connection))

    with (
        fake_server(silent) as port,
        BlockingTCPStore("127.0.0.1", port, timeout=0.2) as store,
        pytest.raises(StoreConnectionError, match=r"no reply to check\('k'\) within 0.2 s"),
    ):
        store.check(["k"])


def test_a_late_reply_to_another_request_is_skipped() -> None:
    """A reply whose id is not the call's (an older call's) does not answer the call."""

    def stale_then_right(connection: socket.socket) -> None:
        request_id = next_request(connection, welcome(connection))
        connection.sendall(
            encode_reply(Status.BYTES, request_id - 1, b"stale")
            + encode_reply(Status.BYTES, request_id, b"right")
        )

    with fake_server(stale_then_right) as port, BlockingTCPStore("127.0.0.1", port) as store:
        assert store.get("k") == b"right"


class CountingSocket:
    """A client's real socket, counting its setsockopt calls."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.options: list[int] = []

    def setsockopt(self, level: int, option: int, value: bytes) -> None:
        self.options.append(option)
        self.sock.setsockopt(level, option, value)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_alternating_sets_and_gets_keep_the_sockets_timeouts(client: BlockingTCPStore) -> None:
    """A set (bounded by the client's timeout) and a get (by its wait and the grace) take
    turns without a setsockopt each: the kernel's receive timeout need only not outlast a
    call's bound (it was two system calls a call, a fifth of the 16-process row's)."""
    counting = CountingSocket(client._connection.sock)
    client._connection.sock = counting  # type: ignore[assignment]
    for i in range(20):
        client.set(f"k{i}", b"v")
        assert client.get(f"k{i}") == b"v"
    assert len(counting.options) <= 2  # the first call's, if any


def test_a_reply_after_the_kernels_timeout_still_answers_its_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wait whose bound is longer than the socket's receive timeout receives again when
    that expires, and gets its reply; a shorter call after it is bounded by its own bound."""
    monkeypatch.setattr("aioelastic.store._blocking.REPLY_GRACE", 0.4)

    def late_then_silent(connection: socket.socket) -> None:
        reader = welcome(connection)
        connection.sendall(encode_reply(Status.BOOL, next_request(connection, reader), True))
        request_id = next_request(connection, reader)
        threading.Event().wait(0.6)  # past the socket's 0.4 s, inside the get's 0.3 + 0.4 s
        connection.sendall(encode_reply(Status.BYTES, request_id, b"late"))
        next_request(connection, reader)  # and the check gets nothing

    with (
        fake_server(late_then_silent) as port,
        BlockingTCPStore("127.0.0.1", port, timeout=0.4) as store,
    ):
        assert store.check(["k"]) is True  # the receive timeout is 0.4 s now
        assert store.get("k", timeout=0.3) == b"late"
        with pytest.raises(StoreConnectionError, match=r"within 0.4 s"):
            store.check(["k"])


def test_close_from_another_thread_ends_a_blocked_call() -> None:
    """A get blocked on the socket raises StoreClosedError when another thread closes."""
    arrived = threading.Event()

    def hold(connection: socket.socket) -> None:
        next_request(connection, welcome(connection))
        arrived.set()

    outcome: list[BaseException] = []
    with fake_server(hold) as port, BlockingTCPStore("127.0.0.1", port) as store:

        def blocked() -> None:
            try:
                store.get("never", timeout=60)
            except BaseException as error:
                outcome.append(error)

        thread = threading.Thread(target=blocked)
        thread.start()
        assert arrived.wait(30)
        store.close()
        thread.join(30)
    assert [type(error) for error in outcome] == [StoreClosedError]
    assert "was closed during get('never')" in str(outcome[0])


# -- through a relaying listener ----------------------------------------------------------------


def test_the_listener_relays_our_protocol_to_the_jobs_store(
    portal: BlockingPortal, served: Served
) -> None:
    """Through a native listener over a prefix of another server's store, the blocking client
    reads and writes that server's keys, waits included."""

    @contextlib.asynccontextmanager
    async def relay() -> AsyncIterator[TorchStoreListener]:
        async with (
            TCPStore("127.0.0.1", served.port) as backing,
            TorchStoreListener(PrefixStore("worlds", backing), native=True) as listener,
        ):
            yield listener

    listener = Served(portal, relay())
    try:
        with BlockingTCPStore("127.0.0.1", listener.port) as store:
            store.set("gen1/0", b"a")
            assert store.add("gen1/count", 5) == 5
            assert store.compare_set("gen1/0", b"a", b"b") == b"b"
            with pytest.raises(StoreTimeoutError, match="'gen1/absent'"):
                store.wait(["gen1/absent"], timeout=0)
        with BlockingTCPStore("127.0.0.1", served.port) as direct:
            assert direct.get("worlds/gen1/0") == b"b"
    finally:
        listener.stop()


def test_a_listener_without_native_refuses_our_client(portal: BlockingPortal) -> None:
    """A torch-only listener treats our preamble as a bad torch stream and hangs up."""
    listener = Served(portal, TorchStoreListener(MemoryStore()))
    try:
        with pytest.raises(StoreConnectionError, match="is it an aioelastic store"):
            BlockingTCPStore("127.0.0.1", listener.port, connect_timeout=0.3)
    finally:
        listener.stop()


def test_an_interrupted_wait_is_withdrawn_and_the_connection_goes_on(
    portal: BlockingPortal, served: Served, client: BlockingTCPStore
) -> None:
    """A wait of a view with an interrupt ends with the check's exception once its socket is
    readable; the server drops the wait; the next call on the connection works."""
    ours, theirs = socket.socketpair()

    def check() -> None:
        if theirs.recv(100) == b"end":
            raise RuntimeError("the world ended")

    view = client.scoped("gen1", interrupt=(theirs, check))
    with ours, theirs:
        ours.sendall(b"noise")  # a check that does not raise: the wait goes on

        def end_soon() -> None:
            ours.sendall(b"end")

        timer = threading.Timer(0.2, end_soon)
        timer.start()
        with pytest.raises(RuntimeError, match="the world ended"):
            view.get("never", timeout=60)
        timer.join()
        assert client.usable
        view.set("k", b"v")
        assert view.get("k") == b"v"
    assert view.get("k") == b"v"  # its interrupt's socket closed: no interrupt any more
    stats = portal.call(lambda: served.service.statistics())
    assert stats.waiting_requests == 0
