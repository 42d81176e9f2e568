"""The TCP store server: a :class:`MemoryStore` core served over the wire protocol.

Each connection is one task that reads frames, answers every request it can answer at once
(everything but a wait on something absent) and writes the replies of one read in one send.
A wait that must park gets its own task in the connection's task group; it holds the wait
server-side and sends its reply when the store wakes it. When the client disconnects, the
connection's task group is cancelled, which withdraws its waiters from the store.

Bad input costs only what it touched: a frame that decodes badly but whose request id is
readable gets a ``BAD_REQUEST`` reply and the connection goes on; a frame whose size or header
cannot be trusted closes that connection. Each connection logs its first problem as a warning
(later ones at debug level) and the :meth:`TCPStoreServer.statistics` counters count them all.
A reply larger than the frame limit (say a ``get_prefix`` over many big values) is replaced by
a ``VALUE_ERROR`` naming its size, so the client raises instead of dropping the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import ipaddress
import logging
import math
import secrets
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from aioelastic._clock import Clock
from aioelastic._loops import on_asyncio
from aioelastic._service import Service
from aioelastic.store._auth import NONCE_SIZE, TOKEN_FILE_ENV, check_proof, new_nonce, proof
from aioelastic.store._errors import (
    StoreClosedError,
    StoreProtocolError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._memory import MemoryStore
from aioelastic.store._peers import OncePerPeer
from aioelastic.store._tcp_codec import (
    DEFAULT_MAX_FRAME_SIZE,
    PREAMBLE,
    PREAMBLE_SIZE,
    VERSION,
    FrameReader,
    Op,
    Request,
    Status,
    decode_preamble,
    decode_request,
    encode_reply,
)
from aioelastic.store._tls import TLS_FAILURES, NotTLSError, tls_failure, wrap_server_stream
from aioelastic.store._torch_codec import looks_like_torch
from aioelastic.store._torch_session import TorchService, TorchSession

log = logging.getLogger("aioelastic.store.tcp")

_RECEIVE_SIZE = 65536
_HANDSHAKE_FRAME_LIMIT = 1024
"""The largest frame body read before a client is authenticated."""


_BACKLOG = 65535
"""Pending connections the kernel may queue (capped by ``net.core.somaxconn``), as anyio's."""


@dataclass(frozen=True, slots=True)
class TCPStoreServerStatistics:
    """A snapshot of a :class:`TCPStoreServer`'s counters."""

    connections: int
    """Connections open now (handshake done or not)."""
    connections_total: int
    requests: int
    waiting_requests: int
    """Requests parked server-side now."""
    bad_requests: int
    """Requests refused with ``BAD_REQUEST`` (the connection stayed open)."""
    dropped_connections: int
    """Connections closed because of what they sent."""
    refused_connections: int
    """Connections refused at the handshake (token, version or TLS)."""
    torch_connections_total: int = 0
    """Connections that spoke torch's ``TCPStore`` protocol (counted in the others too)."""


def _bound_port(listener: asyncio.AbstractServer, endpoint: str) -> int:
    """The port ``listener`` listens on.

    Two processes binding one port with SO_REUSEADDR before either listens both bind; the
    loser's ``listen()`` then fails inside uvloop, which leaves the server without a socket
    instead of raising. Report that as the address-in-use error it is.
    """
    sockets = list(getattr(listener, "sockets", None) or ())
    if not sockets or sockets[0] is None:
        raise OSError(errno.EADDRINUSE, f"could not listen on {endpoint}: address already in use")
    port: int = sockets[0].getsockname()[1]
    return port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


OPEN_SERVER_HINT = (
    "accepts any client that can reach it: no token and no TLS; set a token on every node: "
    f"aioelastic run --rdzv-conf token_file=PATH (or {TOKEN_FILE_ENV}=PATH), "
    "aioelastic store-server --token-file PATH; require_auth=true makes this an error"
)
"""Said when a store listens beyond loopback without a token."""

_WARNED_OPEN: set[str] = set()
"""Endpoints already warned about, so a restarted rendezvous does not repeat the warning."""


class TCPStoreServer(Service):
    """Serves a :class:`MemoryStore` over TCP to :class:`aioelastic.store.TCPStore` clients.

    ``port=0`` picks a free port; :attr:`port` reports it once serving. With ``token``, a client
    must prove it holds the same token or is refused (the token itself never crosses the wire).
    With ``ssl`` (a server context, see :mod:`._tls`), clients speak TLS and a client without
    a valid certificate is refused before any request is read. With neither, on a non-loopback
    address, the server logs a warning, once per endpoint;
    ``require_auth=True`` makes that a ``ValueError`` instead. ``clock`` drives TTLs and
    timeouts (tests pass a manual clock). Use ``async with server:`` or
    ``await tg.start(server.serve)``.

    The same port also serves torch's ``TCPStore`` clients (told apart by their first byte),
    in the same keyspace. A torch client can send neither a token nor TLS, so a server with
    either refuses them unless ``torch_clients=True`` lets them in anyway (not through TLS).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | bytes | None = None,
        clock: Clock | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        handshake_timeout: float = 10.0,
        require_auth: bool = False,
        ssl: ssl.SSLContext | None = None,
        torch_clients: bool | None = None,
    ) -> None:
        self.host = host
        self.ssl = ssl
        self.requested_port = port
        self.store = MemoryStore(clock=clock)
        self.torch = TorchService(self.store, max_value_size=max_frame_size)
        self.torch_clients = (
            (token is None and ssl is None) if torch_clients is None else torch_clients
        )
        self.max_frame_size = max_frame_size
        self.handshake_timeout = handshake_timeout
        self.epoch = secrets.randbits(63)
        self._token = token.encode() if isinstance(token, str) else token
        if require_auth and self.open_to_anyone:
            raise ValueError(
                f"refusing to serve the store on {host}:{port} without a token: any client that "
                "can reach it could read and write every key; set a token on every node "
                f"(token_file=PATH or {TOKEN_FILE_ENV}=PATH), or bind a loopback address"
            )
        self._port: int | None = None
        self._waits: anyio.abc.TaskGroup | None = None
        self._connections = 0
        self._connections_total = 0
        self._requests = 0
        self._waiting = 0
        self._bad_requests = 0
        self._dropped = 0
        self._refused = 0
        self._unauthenticated = OncePerPeer()

    @property
    def port(self) -> int:
        """The bound port; raises ``RuntimeError`` before the server listens."""
        if self._port is None:
            raise RuntimeError("the server is not listening yet: use `async with server:` first")
        return self._port

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def open_to_anyone(self) -> bool:
        """Whether any client that can reach a non-loopback address may use the store."""
        checks_clients = self.ssl is not None and self.ssl.verify_mode == ssl.CERT_REQUIRED
        return self._token is None and not checks_clients and not _is_loopback(self.host)

    def statistics(self) -> TCPStoreServerStatistics:
        """Return a snapshot of the connection and request counters."""
        torch = self.torch.statistics()
        return TCPStoreServerStatistics(
            connections=self._connections,
            connections_total=self._connections_total,
            requests=self._requests + torch.requests,
            waiting_requests=self._waiting + torch.waiting_requests,
            bad_requests=self._bad_requests,
            dropped_connections=self._dropped + torch.dropped_connections,
            refused_connections=self._refused,
            torch_connections_total=torch.connections_total,
        )

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled; reports the bound port through ``task_status``."""
        try:
            async with anyio.create_task_group() as waits:
                self._waits = waits
                if on_asyncio() and self.ssl is None:
                    await self._serve_asyncio(task_status)
                else:
                    await self._serve_streams(task_status)
        finally:
            self._waits = None
            await self.store.aclose()

    def _listening(self, port: int) -> None:
        self._port = port
        if self.open_to_anyone and self.endpoint not in _WARNED_OPEN:
            _WARNED_OPEN.add(self.endpoint)
            log.warning("store server on %s %s", self.endpoint, OPEN_SERVER_HINT)
        log.info("store server listening on %s", self.endpoint)

    async def _serve_asyncio(self, task_status: anyio.abc.TaskStatus[int]) -> None:
        """Serve through asyncio protocols: replies are written from the read callback."""
        loop = asyncio.get_running_loop()
        connections: set[_AsyncioConnection] = set()
        # asyncio's default backlog of 100 overflows under a burst of connections: the kernel
        # then leaves clients connected on their side but never accepted (no timeout applies).
        listener = await loop.create_server(
            lambda: _AsyncioConnection(self, connections),
            self.host,
            self.requested_port,
            backlog=_BACKLOG,
        )
        try:
            self._listening(_bound_port(listener, f"{self.host}:{self.requested_port}"))
            task_status.started(self.port)
            await anyio.sleep_forever()
        finally:
            listener.close()
            for connection in list(connections):
                connection.transport.abort()

    async def _serve_streams(self, task_status: anyio.abc.TaskStatus[int]) -> None:
        """Serve through anyio streams (trio, or TLS: the handshake runs in the connection's
        task, so a peer that fails it is counted and refused before anything is read)."""
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.requested_port
        )
        async with listener:
            self._listening(listener.extra(SocketAttribute.local_port))
            task_status.started(self.port)
            await listener.serve(self._serve_stream)

    async def _serve_stream(self, stream: anyio.abc.SocketStream) -> None:
        lock = anyio.Lock()
        channel: anyio.abc.ByteStream = stream  # the TLS stream over it, once TLS is up

        async def send(data: bytes) -> None:
            async with lock:
                await channel.send(data)

        try:
            address = stream.extra(SocketAttribute.remote_address)
        except anyio.TypedAttributeLookupError:
            address = None
        session = _Session(self, _peer_name(address), send, lambda: self._spawn(channel.aclose))
        try:
            async with stream:
                with anyio.move_on_after(self.handshake_timeout):
                    if self.ssl is not None:
                        try:
                            channel = await wrap_server_stream(stream, self.ssl)
                        except TLS_FAILURES as error:
                            refusal = session.refuse_tls(error)
                            if isinstance(error, NotTLSError) and error.first.startswith(PREAMBLE):
                                await stream.send(refusal)  # our client, without TLS: say so
                            return
                    while session.phase is not _Phase.OPEN:
                        if not await self._exchange(channel, session, send):
                            return
                if session.phase is not _Phase.OPEN:
                    session.expire_handshake()
                    return
                while await self._exchange(channel, session, send):
                    pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the client went away
        except OSError as error:
            log.debug("store client %s: connection error: %s", session.peer, error)
        finally:
            session.close()

    def _spawn(self, function: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``function`` in the server's task group (it is cancelled when the server stops)."""
        if self._waits is not None:
            self._waits.start_soon(function)

    @staticmethod
    async def _exchange(
        stream: anyio.abc.ByteStream,
        session: _Session,
        send: Callable[[bytes], Awaitable[None]],
    ) -> bool:
        """Receive once, send what the session answers; return whether to go on."""
        replies = session.receive(await stream.receive(_RECEIVE_SIZE))
        if replies:
            await send(replies)
        return not session.closing


class _Phase(enum.Enum):
    PREAMBLE = "preamble"
    HELLO = "hello"
    AUTH = "auth"
    OPEN = "open"
    CLOSED = "closed"


def _peer_name(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return "unknown peer" if address is None else str(address)


class _AsyncioConnection(asyncio.Protocol):
    """Drives a :class:`_Session` from asyncio's callbacks (no task per read or reply)."""

    transport: asyncio.Transport

    def __init__(self, server: TCPStoreServer, connections: set[_AsyncioConnection]) -> None:
        self.server = server
        self.connections = connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.connections.add(self)
        self.session = _Session(
            self.server,
            _peer_name(transport.get_extra_info("peername")),
            self.send,
            self.transport.close,
        )
        self.timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            self.server.handshake_timeout, self._handshake_expired
        )

    def data_received(self, data: bytes) -> None:
        session = self.session
        replies = session.receive(data)
        if replies:
            self.transport.write(replies)
        if session.closing:
            self.transport.close()
        elif self.timer is not None and session.phase is _Phase.OPEN:
            self.timer.cancel()
            self.timer = None

    def _handshake_expired(self) -> None:
        self.timer = None
        if self.session.phase is not _Phase.OPEN:
            self.session.expire_handshake()
            self.transport.abort()

    def pause_writing(self) -> None:
        self.transport.pause_reading()  # a client that does not read gets no more answers

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.connections.discard(self)
        self.session.close()

    async def send(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)


class _Session:
    """One connection's protocol state, without I/O: bytes in, reply bytes out.

    The handshake (preamble, version, token) comes first; then each request is answered at
    once, or parked in the server's task group when it must wait (its reply then goes out
    through ``send``). :meth:`close` withdraws the connection's parked waits.
    """

    def __init__(
        self,
        server: TCPStoreServer,
        peer: str,
        send: Callable[[bytes], Awaitable[None]],
        hangup: Callable[[], object],
    ) -> None:
        server._connections += 1
        server._connections_total += 1
        self.server = server
        self.store = server.store
        self.peer = peer
        self.send = send
        self.phase = _Phase.PREAMBLE
        self.closing = False
        self.pending = b""  # handshake bytes not yet answered
        self.reader = FrameReader(server.max_frame_size)
        self.client_nonce = self.server_nonce = b""
        self.waits: dict[int, anyio.CancelScope] = {}
        self.reported = False
        self.hangup = hangup
        self.torch: TorchSession | None = None
        self.handlers: dict[Op, Callable[[Request], bytes | None]] = {
            Op.SET: self._set,
            Op.GET: self._get,
            Op.ADD: self._add,
            Op.COMPARE_SET: self._compare_set,
            Op.WAIT: self._wait,
            Op.CHECK: self._check,
            Op.DELETE_KEY: self._delete_key,
            Op.NUM_KEYS: self._num_keys,
            Op.MULTI_GET: self._multi_get,
            Op.MULTI_SET: self._multi_set,
            Op.APPEND: self._append,
            Op.GET_PREFIX: self._get_prefix,
            Op.TTL_REMAINING: self._ttl_remaining,
            Op.WAIT_FOR_CHANGE: self._wait_for_change,
            Op.CANCEL: self._cancel,
            Op.HELLO: self._handshake_again,
            Op.AUTH: self._handshake_again,
        }

    def report(self, reason: str) -> None:
        """Log a problem with this client: the first as a warning, the rest at debug level.

        Before the handshake is done only a host's first problem is a warning, so a host that
        keeps knocking with no or a wrong token, or with garbage, cannot flood the log.
        """
        first = not self.reported and (
            self.phase is _Phase.OPEN or self.server._unauthenticated.first(self.peer)
        )
        self.reported = True
        if first and self.phase is not _Phase.OPEN:
            reason += " (further problems from this host before a handshake: debug level)"
        log.log(
            logging.WARNING if first else logging.DEBUG, "store client %s: %s", self.peer, reason
        )

    def close(self) -> None:
        """The connection is gone: withdraw its waits (once)."""
        if self.phase is _Phase.CLOSED:
            return
        self.phase = _Phase.CLOSED
        self.server._connections -= 1
        for scope in self.waits.values():
            scope.cancel()
        if self.torch is not None:
            self.torch.close()

    def expire_handshake(self) -> None:
        self.server._dropped += 1
        self.report(
            f"no handshake within {self.server.handshake_timeout:g} s; closing the connection"
        )

    def _drop(self, reason: str) -> None:
        self.server._dropped += 1
        self.report(f"{reason}; closing the connection")
        self.closing = True

    def refuse_tls(self, error: BaseException) -> bytes:
        """The TLS handshake failed: count and report the refusal (no request was read);
        return the ``REFUSED`` reply, for a client that speaks in clear."""
        return self._refuse(f"TLS handshake failed: {tls_failure(error)}")

    def _refuse(self, reason: str) -> bytes:
        self.server._refused += 1
        self.report(f"refused: {reason}")
        self.closing = True
        return encode_reply(Status.REFUSED, 0, reason)

    def receive(self, data: bytes) -> bytes:
        """Take received bytes; return the replies to send now (maybe empty)."""
        if self.closing or self.phase is _Phase.CLOSED:
            return b""
        if self.torch is not None:
            return self.torch.receive(data)
        if self.phase is _Phase.PREAMBLE and not self.pending and looks_like_torch(data):
            return self._speak_torch(data)
        if self.phase is not _Phase.OPEN:
            handshake, data = self._handshake(data)
            return handshake + self._requests(data) if data else handshake
        return self._requests(data)

    def _speak_torch(self, data: bytes) -> bytes:
        """The client is torch's: hand the connection to a torch session (or refuse it)."""
        server = self.server
        if not server.torch_clients:
            self._refuse(
                "a torch TCPStore client, which cannot send this server's token; serve torch "
                "clients on a server without a token, or through the agent's loopback listener"
            )
            return b""
        self.torch = server.torch.session(self.peer, send=self.send, hangup=self.hangup)
        self.phase = _Phase.OPEN
        server._spawn(self.torch.serve)
        return self.torch.receive(data)

    def _handshake(self, data: bytes) -> tuple[bytes, bytes]:
        """Answer the handshake frames in ``data``; return the replies and the bytes after it.

        Frames are split here, one at a time and at most :data:`_HANDSHAKE_FRAME_LIMIT` bytes
        each, so an unauthenticated peer cannot make the server buffer a large frame, and the
        requests a client sends right behind its ``HELLO`` are read under the full limit.
        """
        pending = self.pending = self.pending + data
        replies: list[bytes] = []
        while not self.closing:
            if self.phase is _Phase.OPEN:
                self.pending = b""
                return b"".join(replies), pending
            if self.phase is _Phase.PREAMBLE:
                if len(pending) < PREAMBLE_SIZE:
                    break
                if (refusal := self._check_preamble(pending[:PREAMBLE_SIZE])) is not None:
                    replies.append(refusal)
                    break
                pending = pending[PREAMBLE_SIZE:]
                self.phase = _Phase.HELLO
                continue
            if len(pending) < 4:
                break
            size = int.from_bytes(pending[:4], "big")
            if size > _HANDSHAKE_FRAME_LIMIT:
                self._drop(
                    f"a handshake frame of {size} bytes, above the {_HANDSHAKE_FRAME_LIMIT}-byte "
                    "limit"
                )
                break
            if len(pending) < 4 + size:
                break
            body, pending = pending[4 : 4 + size], pending[4 + size :]
            replies.append(self._hello(body))
        self.pending = pending
        return b"".join(replies), b""

    def _check_preamble(self, preamble: bytes) -> bytes | None:
        """Return the refusal of a preamble (or drop the connection), None if it is ours."""
        try:
            version = decode_preamble(preamble)
        except StoreProtocolError as error:
            self._drop(error.reason)
            return b""
        if version != VERSION:
            return self._refuse(
                f"the client speaks store protocol version {version}, the server {VERSION}; "
                "use the same aioelastic version on both ends"
            )
        return None

    def _requests(self, data: bytes) -> bytes:
        """Answer the requests in ``data`` (the handshake is done)."""
        try:
            bodies = self.reader.feed(data)
        except StoreProtocolError as error:
            self._drop(error.reason)
            return b""
        replies: list[bytes] = []
        for body in bodies:
            if (reply := self._answer(body)) is not None:
                replies.append(reply)
        return replies[0] if len(replies) == 1 else b"".join(replies)

    def _hello(self, body: bytes) -> bytes:
        """Answer a handshake frame: ``HELLO``, then ``AUTH`` when the server has a token."""
        try:
            frame = decode_request(body)
        except StoreProtocolError as error:
            self._drop(f"bad handshake frame: {error.reason}")
            return b""
        expected = Op.HELLO if self.phase is _Phase.HELLO else Op.AUTH
        if frame.op is not expected:
            return self._refuse(f"expected {expected.name} in the handshake, not {frame.op.name}")
        (nonce_or_proof,) = frame.fields
        assert isinstance(nonce_or_proof, bytes)
        token = self.server._token
        if token is None:
            return self._welcome(frame.request_id, b"")
        if frame.op is Op.HELLO:
            if not nonce_or_proof:
                return self._refuse(
                    "this server requires a token; give the client the server's token "
                    "(TCPStore(token=...), --rdzv-conf token_file=PATH)"
                )
            if len(nonce_or_proof) != NONCE_SIZE:
                return self._refuse(f"a HELLO nonce must be {NONCE_SIZE} bytes")
            self.client_nonce, self.server_nonce = nonce_or_proof, new_nonce()
            self.phase = _Phase.AUTH
            return encode_reply(Status.CHALLENGE, frame.request_id, self.server_nonce)
        if not check_proof(token, "client", self.client_nonce, self.server_nonce, nonce_or_proof):
            return self._refuse(
                "the token does not match the server's; use the same token file on every node"
            )
        return self._welcome(
            frame.request_id, proof(token, "server", self.client_nonce, self.server_nonce)
        )

    def _welcome(self, request_id: int, server_proof: bytes) -> bytes:
        self.phase = _Phase.OPEN
        server = self.server
        return encode_reply(
            Status.WELCOME, request_id, server.epoch, server.max_frame_size, server_proof
        )

    def _answer(self, body: bytes) -> bytes | None:
        """Return the encoded reply to one request, or None if it has none yet."""
        try:
            request = decode_request(body)
        except StoreProtocolError as error:
            self.server._bad_requests += 1
            self.report(f"bad request: {error.reason}")
            if error.request_id is None:
                return None
            return encode_reply(Status.BAD_REQUEST, error.request_id, error.reason)
        self.server._requests += 1
        try:
            reply = self.handlers[request.op](request)
            return reply if reply is None else self._fit(request, reply)
        except StoreValueError as error:
            return encode_reply(Status.VALUE_ERROR, request.request_id, str(error))
        except StoreClosedError as error:
            return encode_reply(Status.CLOSED, request.request_id, str(error))
        except (ValueError, TypeError) as error:
            return encode_reply(Status.INVALID, request.request_id, str(error))

    def _fit(self, request: Request, reply: bytes) -> bytes:
        """Return ``reply``, or a ``VALUE_ERROR`` if it is above the frame limit.

        The client learnt the limit at the handshake; a larger reply would make it drop the
        connection and re-send the request, again and again.
        """
        size, limit = len(reply) - 4, self.server.max_frame_size
        if size <= limit:
            return reply
        return encode_reply(
            Status.VALUE_ERROR,
            request.request_id,
            f"the reply to {request.op.name.lower()} would be a frame of {size} bytes, which "
            f"exceeds the maximum frame size of {limit}; read fewer or smaller keys at once "
            "(a narrower prefix, fewer keys per multi_get) or raise max_frame_size on both ends",
        )

    # -- requests answered at once --------------------------------------------------------

    def _set(self, request: Request) -> bytes:
        key, value, ttl = request.fields
        self.store.set_nowait(key, value, ttl=ttl)  # type: ignore[arg-type]
        return encode_reply(Status.OK, request.request_id)

    def _add(self, request: Request) -> bytes:
        key, amount = request.fields
        total = self.store.add_nowait(key, amount)  # type: ignore[arg-type]
        return encode_reply(Status.INT, request.request_id, total)

    def _compare_set(self, request: Request) -> bytes:
        key, expected, desired = request.fields
        stored = self.store.compare_set_nowait(key, expected, desired)  # type: ignore[arg-type]
        return encode_reply(Status.BYTES, request.request_id, stored)

    def _check(self, request: Request) -> bytes:
        (keys,) = request.fields
        found = self.store.check_nowait(keys)  # type: ignore[arg-type]
        return encode_reply(Status.BOOL, request.request_id, found)

    def _delete_key(self, request: Request) -> bytes:
        (key,) = request.fields
        existed = self.store.delete_nowait(key)  # type: ignore[arg-type]
        return encode_reply(Status.BOOL, request.request_id, existed)

    def _num_keys(self, request: Request) -> bytes:
        return encode_reply(Status.INT, request.request_id, self.store.num_keys_nowait())

    def _multi_set(self, request: Request) -> bytes:
        keys, values = request.fields
        self.store.multi_set_nowait(keys, values)  # type: ignore[arg-type]
        return encode_reply(Status.OK, request.request_id)

    def _append(self, request: Request) -> bytes:
        key, value = request.fields
        self.store.append_nowait(key, value)  # type: ignore[arg-type]
        return encode_reply(Status.OK, request.request_id)

    def _ttl_remaining(self, request: Request) -> bytes:
        (key,) = request.fields
        remaining = self.store.ttl_remaining_nowait(key)  # type: ignore[arg-type]
        return encode_reply(Status.SECONDS, request.request_id, remaining)

    def _get_prefix(self, request: Request) -> bytes:
        (prefix,) = request.fields
        snapshot = self.store.get_prefix_nowait(prefix)  # type: ignore[arg-type]
        items = snapshot.items
        return encode_reply(
            Status.SNAPSHOT,
            request.request_id,
            snapshot.revision,
            list(items),
            list(items.values()),
        )

    def _handshake_again(self, request: Request) -> bytes:
        return encode_reply(
            Status.BAD_REQUEST,
            request.request_id,
            f"{request.op.name} after the handshake: HELLO was already sent",
        )

    def _cancel(self, request: Request) -> None:
        scope = self.waits.get(request.request_id)
        if scope is not None:
            scope.cancel()

    # -- requests that may wait -----------------------------------------------------------

    def _get(self, request: Request) -> bytes | None:
        key, _timeout = request.fields
        values = self.store.get_nowait((key,))  # type: ignore[arg-type]
        if values is not None:
            return encode_reply(Status.BYTES, request.request_id, values[0])
        return self._park(request)

    def _multi_get(self, request: Request) -> bytes | None:
        keys, _timeout = request.fields
        values = self.store.get_nowait(keys)  # type: ignore[arg-type]
        if values is not None:
            return encode_reply(Status.VALUES, request.request_id, values)
        return self._park(request)

    def _wait(self, request: Request) -> bytes | None:
        keys, _timeout = request.fields
        if self.store.check_nowait(keys):  # type: ignore[arg-type]
            return encode_reply(Status.OK, request.request_id)
        return self._park(request)

    def _wait_for_change(self, request: Request) -> bytes | None:
        prefix, after, _ = request.fields
        if self.store.changed_since(prefix, after):  # type: ignore[arg-type]
            return encode_reply(Status.INT, request.request_id, self.store.revision)
        return self._park(request)

    def _park(self, request: Request) -> bytes | None:
        timeout = request.fields[-1]
        assert isinstance(timeout, float)
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        if request.request_id in self.waits:
            return encode_reply(
                Status.BAD_REQUEST,
                request.request_id,
                f"request id {request.request_id} is already waiting on this connection",
            )
        waits = self.server._waits
        assert waits is not None
        scope = anyio.CancelScope()
        self.waits[request.request_id] = scope
        waits.start_soon(self._hold, request, scope)
        return None

    async def _hold(self, request: Request, scope: anyio.CancelScope) -> None:
        """Wait server-side, then send the reply (unless the client cancelled the request)."""
        self.server._waiting += 1
        reply: bytes | None = None
        try:
            with scope:
                reply = await self._wait_reply(request)
        finally:
            self.server._waiting -= 1
            del self.waits[request.request_id]
        if reply is not None and self.phase is _Phase.OPEN:
            # If the client went away meanwhile, the connection cleans up.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await self.send(self._fit(request, reply))

    async def _wait_reply(self, request: Request) -> bytes:
        store, request_id, fields = self.store, request.request_id, request.fields
        try:
            if request.op is Op.GET:
                value = await store.get(fields[0], timeout=fields[1])  # type: ignore[arg-type]
                return encode_reply(Status.BYTES, request_id, value)
            if request.op is Op.MULTI_GET:
                values = await store.multi_get(fields[0], timeout=fields[1])  # type: ignore[arg-type]
                return encode_reply(Status.VALUES, request_id, values)
            if request.op is Op.WAIT:
                await store.wait(fields[0], timeout=fields[1])  # type: ignore[arg-type]
                return encode_reply(Status.OK, request_id)
            prefix, after, timeout = fields
            revision = await store.wait_for_change(prefix, after=after, timeout=timeout)  # type: ignore[arg-type]
            return encode_reply(Status.INT, request_id, revision)
        except StoreTimeoutError as error:
            return encode_reply(Status.TIMEOUT, request_id, list(error.keys), error.timeout)
        except StoreClosedError as error:
            return encode_reply(Status.CLOSED, request_id, str(error))
