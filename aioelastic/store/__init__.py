"""The async key-value store: one contract, several backends.

Backends are added to ``__all__`` as they land (MemoryStore, PrefixStore, TCPStore,
TCPStoreServer, EtcdStore).
"""

from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value
from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    StoreValueError,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "Snapshot",
    "Store",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreTimeoutError",
    "StoreValueError",
    "Value",
]
