"""A listener that serves torch's ``TCPStore`` protocol (and, asked, ours) over any store.

The elastic agent runs one on loopback for its own workers, backed by the job's store (a
:class:`~aioelastic.store.TCPStore` client, an etcd store, a prefix of either): torch's
``init_process_group`` then meets the job's keyspace without any worker binding a port. With
``native=True`` the same port also serves aioelastic's own protocol (the async
:class:`~aioelastic.store.TCPStore` and :class:`~aioelastic.store.BlockingTCPStore` clients),
relayed to the same store (:mod:`._relay`): the two are told apart by their first bytes, as
:class:`~aioelastic.store.TCPStoreServer` tells them, so workers with and without torch meet
in one keyspace. Use the server where the keys live in it; use this where they live elsewhere.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from aioelastic._service import Service
from aioelastic.store._api import Store
from aioelastic.store._peers import OncePerPeer
from aioelastic.store._relay import RelaySession, RelayStatistics
from aioelastic.store._tcp_codec import DEFAULT_MAX_FRAME_SIZE
from aioelastic.store._tcp_server import _is_loopback
from aioelastic.store._tcp_session import SessionPolicy
from aioelastic.store._tcp_transport import Link, serve_stream
from aioelastic.store._torch_session import TorchService, TorchServiceStatistics

log = logging.getLogger("aioelastic.store.torch")


class TorchStoreListener(Service):
    """Serves torch ``TCPStore(host, port, is_master=False)`` clients over ``store``; with
    ``native=True``, aioelastic's store clients too.

    Loopback only unless ``expose=True``: torch clients cannot authenticate, so whoever
    reaches the port can read and write every key of ``store`` (our clients are not asked for
    a token here either). ``port=0`` picks a free port (:attr:`port`, once serving). The store
    is not closed on exit: the caller owns it.
    """

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        expose: bool = False,
        native: bool = False,
        handshake_timeout: float = 10.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        if not expose and not _is_loopback(host):
            raise ValueError(
                f"refusing to serve torch's store protocol on {host}: torch clients cannot "
                "send a token, so anyone who reaches the port could read and write every key; "
                "listen on 127.0.0.1, or pass expose=True (--expose-torch-store) on purpose"
            )
        self.service = TorchService(store)
        self.native = native
        self.handshake_timeout = handshake_timeout
        self.max_frame_size = max_frame_size
        self.epoch = secrets.randbits(63)
        self._unauthenticated = OncePerPeer()
        self._relayed: set[RelaySession] = set()
        self._relayed_total = 0
        self._relayed_closed = [0, 0, 0]  # requests, bad requests, store failures of closed ones
        self.host = host
        self.requested_port = port
        self._port: int | None = None
        self._sessions: anyio.abc.TaskGroup | None = None

    @property
    def store(self) -> Store:
        """The store the torch clients read and write."""
        return self.service.store

    def use_store(self, store: Store) -> None:
        """Serve ``store`` (and fresh queues) to the connections opened from now on.

        Connections already open keep the store they started with, so a client of an earlier
        attempt never writes into the next one's keys; the epoch changes, so one of our clients
        that reconnects learns that the keys it knew are gone.
        """
        self.service.use_store(store)
        self.epoch = secrets.randbits(63)

    @property
    def port(self) -> int:
        """The bound port; raises ``RuntimeError`` before the listener listens."""
        if self._port is None:
            raise RuntimeError("the listener is not listening yet: use `async with` first")
        return self._port

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def statistics(self) -> TorchServiceStatistics:
        """Return a snapshot of the connection and request counters."""
        return self.service.statistics()

    def relay_statistics(self) -> RelayStatistics:
        """Return a snapshot of the counters of our protocol's connections (``native``)."""
        requests, bad, failures = self._relayed_closed
        for session in self._relayed:
            requests += session.counts.requests
            bad += session.counts.bad_requests
            failures += session.failed is not None
        return RelayStatistics(
            connections=len(self._relayed),
            connections_total=self._relayed_total,
            requests=requests,
            waiting_requests=sum(session.waiting for session in self._relayed),
            bad_requests=bad,
            store_failures=failures,
        )

    @property
    def torch(self) -> TorchService:
        return self.service

    def new_session(self, peer: str) -> RelaySession | None:
        """Our protocol's session for a new connection (which hands a torch client over to a
        torch session); None, so it speaks torch's at once, unless ``native``."""
        if not self.native:
            return None
        policy = SessionPolicy(
            epoch=self.epoch,
            max_frame_size=self.max_frame_size,
            handshake_timeout=self.handshake_timeout,
            token=None,
            torch_clients=True,
            unauthenticated=self._unauthenticated,
        )
        return RelaySession(self.store, peer, policy)

    def spawn(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``function(*args)`` in the listener's task group."""
        if self._sessions is not None:
            self._sessions.start_soon(function, *args)

    def opened(self, link: Link) -> None:
        """Start relaying a native connection (the torch service counts its own)."""
        session = link.session
        if isinstance(session, RelaySession):
            self._relayed.add(session)
            self._relayed_total += 1
            self.spawn(session.serve, link.sender.send, link.sender.close)

    def closed(self, link: Link) -> None:
        """Keep a closed native connection's counts (the torch service counts its own)."""
        session = link.session
        if isinstance(session, RelaySession) and session in self._relayed:
            self._relayed.discard(session)
            counts = self._relayed_closed
            counts[0] += session.counts.requests
            counts[1] += session.counts.bad_requests
            counts[2] += session.failed is not None

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled; reports the bound port through ``task_status``."""
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.requested_port
        )
        try:
            async with listener, anyio.create_task_group() as sessions:
                self._sessions = sessions
                self._port = listener.extra(SocketAttribute.local_port)
                log.info(
                    "torch store protocol served on %s for %s", self.endpoint, self.store.endpoint
                )
                task_status.started(self._port)
                serve = partial(serve_stream, self, handshake_timeout=self.handshake_timeout)
                await listener.serve(serve)
        finally:
            self._sessions = None
