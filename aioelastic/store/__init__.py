"""The async key-value store: one contract, several backends.

Backends are added to ``__all__`` as they land (TCPStore, TCPStoreServer, EtcdStore).
"""

from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value
from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._memory import MemoryStore, MemoryStoreStatistics
from aioelastic.store._prefix import PrefixStore

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
    "StoreTimeoutError",
    "StoreValueError",
    "Value",
]
