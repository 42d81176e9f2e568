"""The store's exceptions: misuse (bad values) apart from infrastructure failure (timeouts,
lost connections)."""

from __future__ import annotations

from collections.abc import Sequence


class StoreError(Exception):
    """Base class of every store failure."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A waiting call did not see its keys (or a change) within its timeout."""

    def __init__(self, keys: Sequence[str], timeout: float, endpoint: str) -> None:
        self.keys = tuple(keys)
        self.timeout = timeout
        self.endpoint = endpoint
        names = ", ".join(repr(k) for k in self.keys)
        super().__init__(
            f"timed out after {timeout:g} s waiting for {names} on {endpoint}; "
            "raise the timeout or check that the peer that should write it is alive"
        )


class StoreConnectionError(StoreError, ConnectionError):
    """The store could not be reached, or the connection to it was lost."""

    def __init__(self, endpoint: str, reason: str) -> None:
        self.endpoint = endpoint
        self.reason = reason
        super().__init__(f"store at {endpoint}: {reason}")


class StoreValueError(StoreError, ValueError):
    """An operation does not fit the stored value (for example ``add`` on a non-integer)."""


class StoreClosedError(StoreError):
    """The store was used after it was closed."""
