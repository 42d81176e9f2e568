"""The TCP store server: a :class:`MemoryStore` core served over the wire protocol.

Each connection is a :class:`~._tcp_transport.Link` driven by asyncio's callbacks (or, on trio
and with TLS, by a task reading an anyio stream); its protocol state is a
:class:`~._tcp_session.Session`, which answers every request it can answer at once (everything
but a wait on something absent) and writes the replies of one read in one send. A wait that
must park gets its own task in the server's task group; it holds the wait server-side and
sends its reply when the store wakes it. When the client disconnects, its waits are cancelled,
which withdraws its waiters from the store.

Bad input costs only what it touched: a frame that decodes badly but whose request id is
readable gets a ``BAD_REQUEST`` reply and the connection goes on; a frame whose size or header
cannot be trusted closes that connection. Each connection logs its first problem as a warning
(later ones at debug level) and the :meth:`TCPStoreServer.statistics` counters count them all.
A reply larger than the frame limit (say a ``get_prefix`` over many big values) is replaced by
a ``VALUE_ERROR`` naming its size, so the client raises instead of dropping the connection.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import secrets
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from aioelastic._clock import Clock
from aioelastic._loops import on_asyncio
from aioelastic._service import Service
from aioelastic.store._auth import TOKEN_FILE_ENV
from aioelastic.store._memory import MemoryStore
from aioelastic.store._peers import OncePerPeer
from aioelastic.store._tcp_codec import DEFAULT_MAX_FRAME_SIZE
from aioelastic.store._tcp_session import Session, SessionCounts, SessionPolicy, StoreSession
from aioelastic.store._tcp_transport import Link, ProtocolConnection, serve_stream
from aioelastic.store._torch_session import TorchService

log = logging.getLogger("aioelastic.store.tcp")

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
        self._links: set[Link] = set()
        self._connections_total = 0
        self._closed_counts = SessionCounts()  # what the sessions of closed connections counted
        self._unauthenticated = OncePerPeer()

    @property
    def _policy(self) -> SessionPolicy:
        return SessionPolicy(
            epoch=self.epoch,
            max_frame_size=self.max_frame_size,
            handshake_timeout=self.handshake_timeout,
            token=self._token,
            torch_clients=self.torch_clients,
            unauthenticated=self._unauthenticated,
        )

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
        counts = SessionCounts()
        counts.add(self._closed_counts)
        waiting = 0
        for link in self._links:
            waiting += link.waiting
            if link.session is not None:
                counts.add(link.session.counts)
        return TCPStoreServerStatistics(
            connections=len(self._links),
            connections_total=self._connections_total,
            requests=counts.requests + torch.requests,
            waiting_requests=waiting + torch.waiting_requests,
            bad_requests=counts.bad_requests,
            dropped_connections=counts.dropped + torch.dropped_connections,
            refused_connections=counts.refused,
            torch_connections_total=torch.connections_total,
        )

    def new_session(self, peer: str) -> Session:
        """The protocol state of a new connection (no I/O: see :mod:`._tcp_session`)."""
        return StoreSession(self.store, peer, self._policy)

    def spawn(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``function(*args)`` in the server's task group (cancelled when it stops)."""
        if self._waits is not None:
            self._waits.start_soon(function, *args)

    def opened(self, link: Link) -> None:
        self._links.add(link)
        self._connections_total += 1

    def closed(self, link: Link) -> None:
        self._links.discard(link)
        if link.session is not None:
            self._closed_counts.add(link.session.counts)

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
        # asyncio's default backlog of 100 overflows under a burst of connections: the kernel
        # then leaves clients connected on their side but never accepted (no timeout applies).
        listener = await loop.create_server(
            lambda: ProtocolConnection(self, self.handshake_timeout),
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
            for link in list(self._links):
                if isinstance(link.sender, ProtocolConnection):
                    link.sender.abort()

    async def _serve_streams(self, task_status: anyio.abc.TaskStatus[int]) -> None:
        """Serve through anyio streams (trio, or TLS: the handshake runs in the connection's
        task, so a peer that fails it is counted and refused before anything is read)."""
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.requested_port
        )
        async with listener:
            self._listening(listener.extra(SocketAttribute.local_port))
            task_status.started(self.port)
            await listener.serve(
                partial(serve_stream, self, handshake_timeout=self.handshake_timeout, tls=self.ssl)
            )
