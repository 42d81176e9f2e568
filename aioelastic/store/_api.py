"""The async key-value :class:`Store` every backend implements.

Semantics follow ``torch.distributed.Store`` where torch has them, so a torch user is never
surprised; two additions make rendezvous event-driven and let it detect dead nodes without
comparing clocks between hosts:

* **TTL keys.** ``set(key, value, ttl=...)`` makes the key expire ``ttl`` seconds (on the
  store's own clock) after that write unless it is written again with a ``ttl``. A write
  without ``ttl`` through ``set``/``multi_set`` makes the key permanent; ``add``, ``append``
  and ``compare_set`` keep whatever expiry the key has.
* **Revisions and change notification.** Every mutation (including a delete or an expiry)
  advances the store's revision. :meth:`Store.get_prefix` returns the items under a prefix
  together with the revision they were read at, and :meth:`Store.wait_for_change` returns once
  something under a prefix changed after a given revision. Read, then wait from the revision
  you read: no change can slip between the two.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

Value = bytes | str
"""A value as callers may pass it: str is encoded as UTF-8, bytes are stored as they are."""

DEFAULT_TIMEOUT = 300.0
"""Default timeout of waiting calls, in seconds (torch's default store timeout)."""


def to_bytes(value: Value) -> bytes:
    """Return ``value`` as bytes, encoding str as UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"store values must be bytes or str, not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The items under a prefix and the store revision they were read at."""

    revision: int
    items: dict[str, bytes] = field(default_factory=dict)


class Store(abc.ABC):
    """An async key-value store shared by the nodes of a job.

    Keys are str; values are bytes (str is accepted and encoded as UTF-8). Calls that wait take a
    keyword-only ``timeout`` in seconds: ``None`` means the store's default (:attr:`timeout`),
    ``math.inf`` waits forever. A timeout raises :class:`StoreTimeoutError`, which is also a
    :class:`TimeoutError`. Use a store as ``async with store:`` (or call :meth:`aclose`) so
    connections and background tasks are released.
    """

    timeout: float = DEFAULT_TIMEOUT

    def resolve_timeout(self, timeout: float | None) -> float:
        """Return the effective timeout for a waiting call: ``timeout`` or the store default."""
        resolved = self.timeout if timeout is None else timeout
        if math.isnan(resolved) or resolved < 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, not {resolved!r}")
        return resolved

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """Where the store lives, for error messages (``memory``, ``tcp://host:port``, ...)."""

    @abc.abstractmethod
    async def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        """Store ``value`` under ``key``; with ``ttl``, the key expires unless written again."""

    @abc.abstractmethod
    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until it exists."""

    @abc.abstractmethod
    async def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer stored at ``key`` (missing counts as 0); return the sum."""

    @abc.abstractmethod
    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; return the value now stored.

        torch's semantics: a missing key with an empty ``expected`` is set. When the key is
        missing and ``expected`` is not empty, nothing is stored and ``expected`` is returned.
        """

    @abc.abstractmethod
    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        """Return once every key in ``keys`` exists."""

    @abc.abstractmethod
    async def check(self, keys: Sequence[str]) -> bool:
        """Return whether every key in ``keys`` exists, without waiting."""

    @abc.abstractmethod
    async def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""

    @abc.abstractmethod
    async def num_keys(self) -> int:
        """Return the number of keys in the store."""

    @abc.abstractmethod
    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        """Return the values of ``keys`` in order, waiting until all exist."""

    @abc.abstractmethod
    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set every key to its value, atomically where the backend allows."""

    @abc.abstractmethod
    async def append(self, key: str, value: Value) -> None:
        """Append ``value`` to the bytes at ``key`` (a missing key starts empty)."""

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> Snapshot:
        """Return every key starting with ``prefix`` and the revision they were read at."""

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        """:meth:`get_prefix` of each prefix, in order: one request at one revision where the
        backend allows (etcd: one transaction); the default reads them one after another."""
        return [await self.get_prefix(prefix) for prefix in prefixes]

    @abc.abstractmethod
    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        """Return once a key starting with ``prefix`` changed at a revision above ``after``.

        A change is a write, a delete or an expiry. Returns the store's revision at wake-up.
        May return early without a change (for example when history was compacted): callers
        re-read with :meth:`get_prefix`, never assume what changed.
        """

    @property
    def counts_keys(self) -> bool:
        """Whether :meth:`multi_set_and_count` is offered: a write that counts the keys under a
        prefix in the same atomic step, without reading them (etcd: one transaction)."""
        return False

    async def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> int:
        """Set every key to its value (as :meth:`multi_set`) and return how many keys are
        under ``prefix`` once they are written, counted in the same atomic step.

        Only where :attr:`counts_keys` is true; the default raises ``NotImplementedError``.
        A reply lost and recovered may count the keys at the write's revision or later.
        """
        raise NotImplementedError(
            f"{type(self).__name__} at {self.endpoint} cannot count keys as it writes; "
            "check counts_keys first"
        )

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        """:meth:`multi_set_and_count`, and the items under ``read`` as they are once the keys
        are written, read in the same atomic step (etcd: a range read in the transaction), so a
        caller learns what its write landed on without a read before it.

        Only where :attr:`counts_keys` is true; the default raises ``NotImplementedError``.
        """
        raise NotImplementedError(
            f"{type(self).__name__} at {self.endpoint} cannot count keys as it writes; "
            "check counts_keys first"
        )

    async def ttl_remaining(self, key: str) -> float | None:
        """Return the seconds left before ``key`` expires, on the store's own clock.

        None when ``key`` is missing or has no TTL. Comparing this with the TTL it was written
        with says how long ago it was written, without comparing clocks between hosts. The
        default answers None for a missing key and raises ``NotImplementedError`` otherwise;
        every built-in backend overrides it.
        """
        if not await self.check([key]):
            return None
        raise NotImplementedError(
            f"{type(self).__name__} at {self.endpoint} cannot say how long a key's TTL has left"
        )

    async def aclose(self) -> None:  # noqa: B027  (optional hook, not abstract)
        """Release connections and background tasks; the default has nothing to release."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:  # a store serving in its own task group returns what the group does
        await self.aclose()
        return None
