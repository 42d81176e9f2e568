"""The async key-value store: one contract, several backends.

``MemoryStore`` is the in-process default (and the TCP server's core); ``PrefixStore`` is a
namespaced view of any store; ``TCPStoreServer`` and ``TCPStore`` share a store across hosts
(the server also speaks torch's ``TCPStore`` protocol on the same port); ``TorchStoreListener``
serves torch's protocol over any store.
``BlockingTCPStore`` is the same protocol's client for synchronous code (blocking sockets).
``EtcdStore`` keeps it in an etcd v3 cluster (extra ``aioelastic[etcd]``; imported on first use,
so importing this package never loads gRPC).
"""

from typing import TYPE_CHECKING

from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value
from aioelastic.store._blocking import BlockingTCPStore
from aioelastic.store._credentials import StoreCredentials
from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreOutcomeUnknownError,
    StoreProtocolError,
    StoreRefusedError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._etcd_events import (
    EtcdFailover,
    EtcdLeaseLost,
    EtcdStoreEvent,
    EtcdStoreStatistics,
    EtcdWatchResumed,
)
from aioelastic.store._memory import MemoryStore, MemoryStoreStatistics
from aioelastic.store._prefix import PrefixStore
from aioelastic.store._relay import RelayStatistics
from aioelastic.store._tcp_client import StoreServerGone, TCPStore
from aioelastic.store._tcp_server import TCPStoreServer, TCPStoreServerStatistics
from aioelastic.store._torch_listener import TorchStoreListener
from aioelastic.store._torch_session import TorchServiceStatistics

if TYPE_CHECKING:
    from aioelastic.store._etcd import EtcdStore


def __getattr__(name: str) -> object:
    if name == "EtcdStore":  # imported on first use: it needs the etcd extra (grpc)
        from aioelastic.store._etcd import EtcdStore

        return EtcdStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_TIMEOUT",
    "BlockingTCPStore",
    "EtcdFailover",
    "EtcdLeaseLost",
    "EtcdStore",
    "EtcdStoreEvent",
    "EtcdStoreStatistics",
    "EtcdWatchResumed",
    "MemoryStore",
    "MemoryStoreStatistics",
    "PrefixStore",
    "RelayStatistics",
    "Snapshot",
    "Store",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreCredentials",
    "StoreError",
    "StoreOutcomeUnknownError",
    "StoreProtocolError",
    "StoreRefusedError",
    "StoreServerGone",
    "StoreTimeoutError",
    "StoreValueError",
    "TCPStore",
    "TCPStoreServer",
    "TCPStoreServerStatistics",
    "TorchServiceStatistics",
    "TorchStoreListener",
    "Value",
]
