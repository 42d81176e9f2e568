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


class StoreProtocolError(StoreError):
    """Bytes on the wire do not follow the TCP store protocol.

    ``request_id`` names the request the bad frame carried, when it could be read, so a server
    can refuse that request alone and keep the connection.
    """

    def __init__(self, reason: str, request_id: int | None = None) -> None:
        self.reason = reason
        self.request_id = request_id
        super().__init__(reason)


class StoreRefusedError(StoreConnectionError):
    """The server refused the connection (wrong or missing token, protocol version mismatch)."""


class StoreOutcomeUnknownError(StoreConnectionError):
    """The connection was lost after a non-idempotent call was sent and before its reply.

    The call (``add``, ``compare_set``, ``append``, ``delete_key``) may or may not have been
    applied; it is not re-sent, so it is never applied twice. Read the key to find out.
    """

    def __init__(self, endpoint: str, operation: str, key: str) -> None:
        self.operation = operation
        self.key = key
        super().__init__(
            endpoint,
            f"the connection was lost before the reply to {operation}({key!r}); it may or may "
            "not have been applied and was not re-sent: read the key to find out",
        )
