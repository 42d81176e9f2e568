"""The async key-value store: one contract, several backends.

``MemoryStore`` is the in-process default (and the TCP server's core); ``PrefixStore`` is a
namespaced view of any store; ``TCPStoreServer`` and ``TCPStore`` share a store across hosts.
"""

from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value
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
from aioelastic.store._memory import MemoryStore, MemoryStoreStatistics
from aioelastic.store._prefix import PrefixStore
from aioelastic.store._tcp_client import TCPStore
from aioelastic.store._tcp_server import TCPStoreServer, TCPStoreServerStatistics

__all__ = [
    "DEFAULT_TIMEOUT",
    "MemoryStore",
    "MemoryStoreStatistics",
    "PrefixStore",
    "Snapshot",
    "Store",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreOutcomeUnknownError",
    "StoreProtocolError",
    "StoreRefusedError",
    "StoreTimeoutError",
    "StoreValueError",
    "TCPStore",
    "TCPStoreServer",
    "TCPStoreServerStatistics",
    "Value",
]
