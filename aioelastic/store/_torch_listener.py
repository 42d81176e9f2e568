"""A listener that serves only torch's ``TCPStore`` protocol, over any aioelastic store.

The elastic agent runs one on loopback for its own workers, backed by the job's store (a
:class:`~aioelastic.store.TCPStore` client, an etcd store, a prefix of either): torch's
``init_process_group`` then meets the job's keyspace without any worker binding a port.
:class:`~aioelastic.store.TCPStoreServer` speaks both protocols on one port instead; use this
where the keys live elsewhere.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from aioelastic._service import Service
from aioelastic.store._api import Store
from aioelastic.store._tcp_server import _is_loopback
from aioelastic.store._torch_session import TorchService, TorchServiceStatistics

log = logging.getLogger("aioelastic.store.torch")

_RECEIVE_SIZE = 65536


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

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled; reports the bound port through ``task_status``."""
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.requested_port
        )
        async with listener, anyio.create_task_group() as sessions:
            self._port = listener.extra(SocketAttribute.local_port)
            log.info("torch store protocol served on %s for %s", self.endpoint, self.store.endpoint)
            task_status.started(self._port)

            async def connection(stream: anyio.abc.SocketStream) -> None:
                await self._serve_connection(stream, sessions)

            await listener.serve(connection)

    async def _serve_connection(
        self, stream: anyio.abc.SocketStream, sessions: anyio.abc.TaskGroup
    ) -> None:
        try:
            address = stream.extra(SocketAttribute.remote_address)
        except anyio.TypedAttributeLookupError:
            address = "unknown peer"
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        lock = anyio.Lock()  # replies from this task and from the session's, one at a time

        async def send(data: bytes) -> None:
            async with lock:
                await stream.send(data)

        with anyio.CancelScope() as reading:
            session = self.service.session(peer, send=send, hangup=reading.cancel)
            sessions.start_soon(session.serve)
            try:
                async with stream:
                    while True:
                        replies = session.receive(await stream.receive(_RECEIVE_SIZE))
                        if replies:
                            await send(replies)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the client went away
            except OSError as error:
                log.debug("torch store client %s: connection error: %s", peer, error)
            finally:
                session.close()
