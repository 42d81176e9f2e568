"""A listener that serves only torch's ``TCPStore`` protocol, over any aioelastic store.

The elastic agent runs one on loopback for its own workers, backed by the job's store (a
:class:`~aioelastic.store.TCPStore` client, an etcd store, a prefix of either): torch's
``init_process_group`` then meets the job's keyspace without any worker binding a port.
:class:`~aioelastic.store.TCPStoreServer` speaks both protocols on one port instead; use this
where the keys live elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from aioelastic._service import Service
from aioelastic.store._api import Store
from aioelastic.store._tcp_server import _is_loopback
from aioelastic.store._tcp_transport import Link, serve_stream
from aioelastic.store._torch_session import TorchService, TorchServiceStatistics

log = logging.getLogger("aioelastic.store.torch")


class TorchStoreListener(Service):
    """Serves torch ``TCPStore(host, port, is_master=False)`` clients over ``store``.

    Loopback only unless ``expose=True``: torch clients cannot authenticate, so whoever
    reaches the port can read and write every key of ``store``. ``port=0`` picks a free port
    (:attr:`port`, once serving). The store is not closed on exit: the caller owns it.
    """

    def __init__(
        self, store: Store, host: str = "127.0.0.1", port: int = 0, *, expose: bool = False
    ) -> None:
        if not expose and not _is_loopback(host):
            raise ValueError(
                f"refusing to serve torch's store protocol on {host}: torch clients cannot "
                "send a token, so anyone who reaches the port could read and write every key; "
                "listen on 127.0.0.1, or pass expose=True (--expose-torch-store) on purpose"
            )
        self.service = TorchService(store)
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
        attempt never writes into the next one's keys.
        """
        self.service.use_store(store)

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

    @property
    def torch(self) -> TorchService:
        return self.service

    def new_session(self, peer: str) -> None:
        """Every connection speaks torch's protocol (there is no native session)."""
        return None

    def spawn(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``function(*args)`` in the listener's task group."""
        if self._sessions is not None:
            self._sessions.start_soon(function, *args)

    def opened(self, link: Link) -> None:
        """The torch service counts its connections itself."""

    def closed(self, link: Link) -> None:
        """The torch service counts its connections itself."""

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
                await listener.serve(partial(serve_stream, self))
        finally:
            self._sessions = None
