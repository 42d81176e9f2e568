"""The etcd v3 connection under :class:`~aioelastic.store.EtcdStore`: channels, auth, retries.

One gRPC channel per endpoint (so host names, TLS server names and per-member failures all
work), the etcd stubs generated in ``aetcd.rpc``, and one retry policy: a call goes to the
endpoint that last answered; an unavailable member, a lost leader or a timed-out attempt moves
it to the next endpoint after an exponential backoff, until the retry budget is spent.
Whether a failed call may be re-sent is the caller's decision (:meth:`EtcdConnection.call`
only re-sends calls marked idempotent).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio

from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreRefusedError,
)
from aioelastic.store._etcd_txn import (
    Get,
    GetResult,
    KeyValue,
    ModRevisionIs,
    Op,
    OpResult,
    Put,
    PutResult,
    Txn,
    TxnResult,
)

_IMPORT_ERROR: ImportError | None = None
try:
    import grpc
    from aetcd import rpc
except ImportError as error:  # pragma: no cover - exercised without the extra installed
    _IMPORT_ERROR = error
    grpc = rpc = None

__all__ = [
    "EtcdConnection",
    "Member",
    "TLSConfig",
    "decode_kv",
    "decode_txn",
    "describe",
    "encode_txn",
    "first_kv",
    "grpc",
    "is_not_found",
    "is_retryable",
    "is_rpc_error",
    "parse_endpoints",
    "require_extra",
    "rpc",
    "settle",
]

T = TypeVar("T")

_CHANNEL_OPTIONS = [
    # Reconnect to a restarted member quickly instead of after grpc's default 1-120 s backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Notice a silently dead member; etcd refuses pings more often than every 5 s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 1.0


def require_extra() -> None:
    """Raise ``ImportError`` naming the extra to install when the etcd client is missing."""
    if _IMPORT_ERROR is not None:
        raise ImportError(
            f"EtcdStore needs the etcd client: pip install 'aioelastic[etcd]' ({_IMPORT_ERROR})"
        ) from _IMPORT_ERROR


def parse_endpoints(endpoints: str | Sequence[str]) -> tuple[list[str], bool]:
    """Return ``host:port`` addresses and whether any was given as ``https://``.

    Accepts ``"h1:2379,h2:2379"`` or a list; a missing port means 2379; ``http://`` and
    ``https://`` prefixes are allowed.
    """
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    addresses: list[str] = []
    https = False
    for raw in items:
        item = raw.strip()
        if item.startswith("https://"):
            https, item = True, item.removeprefix("https://")
        item = item.removeprefix("http://").rstrip("/")
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "2379"
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"etcd endpoint {raw!r} has no valid port; use host:port")
        addresses.append(f"{host}:{port}")
    if not addresses:
        raise ValueError(f"no etcd endpoint in {endpoints!r}; pass 'host:port[,host:port...]'")
    return addresses, https


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """PEM files for TLS: the CA that signed the members and, optionally, a client cert."""

    ca_cert: str | Path | None = None
    cert: str | Path | None = None
    key: str | Path | None = None

    def credentials(self) -> Any:
        """Return grpc channel credentials, reading the files now (clear errors if missing)."""
        if (self.cert is None) != (self.key is None):
            raise ValueError("etcd TLS needs both cert and key for a client certificate")
        return grpc.ssl_channel_credentials(
            root_certificates=_read_pem("ca_cert", self.ca_cert),
            private_key=_read_pem("key", self.key),
            certificate_chain=_read_pem("cert", self.cert),
        )


def _read_pem(name: str, path: str | Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read etcd TLS {name} file {str(path)!r}: {error}") from None


class Member:
    """One endpoint: its channel, the etcd stubs on it and the auth token it was given."""

    def __init__(self, address: str, credentials: Any | None) -> None:
        self.address = address
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        else:
            self.channel = grpc.aio.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
        self.kv = rpc.KVStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.auth = rpc.AuthStub(self.channel)
        self.metadata: tuple[tuple[str, str], ...] | None = None


async def settle(awaitable: Awaitable[T]) -> T:
    """Await a gRPC call so that anyio cancellation works through it.

    grpc.aio replaces the cancellation it receives with a bare ``CancelledError`` that anyio's
    cancel scopes do not recognise (they would let it escape). Re-enter a checkpoint so a
    cancelled scope raises its own; a cancellation nobody asked for means grpc cancelled the
    call itself because the channel closed.
    """
    try:
        return await awaitable
    except asyncio.CancelledError:
        await anyio.lowlevel.checkpoint_if_cancelled()
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise StoreClosedError("the etcd store's channel closed during the call") from None


def _is_retryable(error: Any) -> bool:
    code = error.code()
    return bool(
        code
        in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.ABORTED,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.CANCELLED,
        )
    )


def is_rpc_error(error: BaseException) -> bool:
    """Return whether ``error`` is a failed gRPC call."""
    return isinstance(error, grpc.aio.AioRpcError)


def is_retryable(error: BaseException) -> bool:
    """Return whether ``error`` is a gRPC failure another attempt (or member) may not have."""
    return isinstance(error, grpc.aio.AioRpcError) and _is_retryable(error)


def is_not_found(error: BaseException) -> bool:
    """Return whether ``error`` is etcd's NOT_FOUND (a lease that no longer exists)."""
    return isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.NOT_FOUND


class EtcdConnection:
    """Channels to every endpoint, with the current one and the retry policy.

    ``request_timeout`` bounds one attempt; ``retry_timeout`` bounds all attempts of one call
    (and how long a member may be unreachable before waits give up).
    """

    def __init__(
        self,
        addresses: list[str],
        *,
        tls: TLSConfig | None,
        user: str | None,
        password: str | None,
        request_timeout: float,
        retry_timeout: float,
        on_failover: Callable[[str, str], None],
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError("etcd authentication needs both user and password")
        self._addresses = addresses
        self._credentials = tls.credentials() if tls is not None else None
        self.members: list[Member] = []
        self.request_timeout = request_timeout
        self.retry_timeout = retry_timeout
        self._user = user
        self._password = password
        self._current = 0
        self._on_failover = on_failover
        self.requests = 0  # attempts sent, watches included (for statistics and benchmarks)
        self.endpoints = ",".join(addresses)

    def open(self) -> None:
        """Create a channel to every endpoint (inside the event loop that will use them)."""
        self.members = [Member(address, self._credentials) for address in self._addresses]
        self._current = 0

    @property
    def current(self) -> Member:
        """The member calls go to first."""
        return self.members[self._current]

    @property
    def current_address(self) -> str:
        """The endpoint calls go to first ("" while closed)."""
        return self.members[self._current].address if self.members else ""

    def failover(self, member: Member, error: BaseException) -> None:
        """Move calls to the next endpoint after ``member`` failed with ``error``."""
        if self.members[self._current] is member and len(self.members) > 1:
            self._current = (self._current + 1) % len(self.members)
        self._on_failover(member.address, describe(error))

    async def authenticate(self, member: Member) -> None:
        """Get an auth token from ``member`` when a user is configured."""
        if self._user is None or member.metadata is not None:
            return
        try:
            response = await member.auth.Authenticate(
                rpc.AuthenticateRequest(name=self._user, password=self._password),
                timeout=self.request_timeout,
            )
        except grpc.aio.AioRpcError as error:
            if _is_retryable(error):
                raise
            raise StoreRefusedError(
                member.address,
                f"etcd refused user {self._user!r}: {error.details()}; "
                "check the user name and password",
            ) from None
        member.metadata = (("token", response.token),)

    async def call(
        self,
        what: str,
        attempt: Callable[[Member, float], Awaitable[T]],
        *,
        idempotent: bool = True,
        budget: float | None = None,
    ) -> T:
        """Run ``attempt(member, timeout)``, failing over and backing off while it may.

        A non-idempotent attempt is tried once (its errors propagate for the caller to check
        the outcome); an idempotent one is retried until ``budget`` (default
        ``retry_timeout``) is spent, then :class:`StoreConnectionError` names the endpoints.
        """
        deadline = anyio.current_time() + (self.retry_timeout if budget is None else budget)
        delay = _BACKOFF_FIRST
        while True:
            if not self.members:
                raise StoreClosedError(f"the etcd store etcd://{self.endpoints} was closed")
            member = self.current
            try:
                await settle(self.authenticate(member))
                self.requests += 1
                return await settle(attempt(member, self.request_timeout))
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNAUTHENTICATED and member.metadata:
                    member.metadata = None  # the token expired: get a new one and retry
                    continue
                if not _is_retryable(error):
                    if error.code() == grpc.StatusCode.NOT_FOUND:
                        raise  # a lease that no longer exists: the caller decides
                    raise self.rejected(member, what, error) from None
                if not idempotent:
                    raise
                self.failover(member, error)
                now = anyio.current_time()
                if now + delay > deadline:
                    raise self.unreachable(what, error) from None
                await anyio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, _BACKOFF_MAX)

    def rejected(self, member: Member, what: str, error: Any) -> StoreError:
        """The error for a call etcd refused (bad credentials, permissions, a bad request)."""
        details = error.details() or ""
        if error.code() == grpc.StatusCode.PERMISSION_DENIED:
            return StoreRefusedError(
                member.address,
                f"etcd denied {what} to user {self._user!r}: {details}; "
                "grant the user read/write access to the key prefix",
            )
        if "user name is empty" in details:
            return StoreRefusedError(
                member.address,
                f"etcd has authentication on: a user name and password are required ({details})",
            )
        return StoreError(f"etcd at {member.address} rejected {what}: {describe(error)}")

    def unreachable(self, what: str, error: BaseException) -> StoreConnectionError:
        """The error for a call that found no working member within the retry budget."""
        return StoreConnectionError(
            f"etcd://{self.endpoints}",
            f"{what} failed on every endpoint for {self.retry_timeout:g} s "
            f"(last error: {describe(error)}); check that the etcd cluster is running and "
            "reachable from this host",
        )

    async def aclose(self) -> None:
        """Close every channel."""
        members, self.members = self.members, []
        for member in members:
            await member.channel.close()


def describe(error: BaseException) -> str:
    """A one-line description of a gRPC (or other) error."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"


def _encode_op(op: Op, into: Any) -> None:
    if isinstance(op, Put):
        put = into.request_put
        put.key, put.value, put.lease, put.ignore_lease = op.key, op.value, op.lease, op.keep_lease
    elif isinstance(op, Get):
        into.request_range.key = op.key
    else:
        _encode_txn(op, into.request_txn)


def _encode_txn(txn: Txn, into: Any) -> None:
    # Filled in place: a message given to a constructor is copied, and nested transactions
    # (an add's fallbacks nest 32 deep) would be copied once per level.
    for compare in txn.compare:
        target = into.compare.add()
        target.key, target.result = compare.key, rpc.Compare.EQUAL
        if isinstance(compare, ModRevisionIs):
            target.target, target.mod_revision = rpc.Compare.MOD, compare.revision
        else:
            target.target, target.value = rpc.Compare.VALUE, compare.value
    for op in txn.success:
        _encode_op(op, into.success.add())
    for op in txn.failure:
        _encode_op(op, into.failure.add())


def encode_txn(txn: Txn) -> Any:
    """The etcd ``TxnRequest`` of ``txn``."""
    request = rpc.TxnRequest()
    _encode_txn(txn, request)
    return request


def decode_kv(kv: Any) -> KeyValue:
    """Our :class:`KeyValue` of an etcd ``KeyValue``."""
    return KeyValue(bytes(kv.key), bytes(kv.value), int(kv.mod_revision), int(kv.lease))


def first_kv(response_range: Any) -> KeyValue | None:
    """The first key of an etcd ``RangeResponse`` (None: no key)."""
    return decode_kv(response_range.kvs[0]) if response_range.kvs else None


def decode_txn(response: Any, revision: int | None = None) -> TxnResult:
    """Our :class:`TxnResult` of an etcd ``TxnResponse`` (nested ones carry the outer revision)."""
    if revision is None:
        revision = int(response.header.revision)
    results: list[OpResult] = []
    for op in response.responses:
        kind = op.WhichOneof("response")
        if kind == "response_range":
            results.append(GetResult(first_kv(op.response_range)))
        elif kind == "response_txn":
            results.append(decode_txn(op.response_txn, revision))
        else:
            results.append(PutResult())
    return TxnResult(bool(response.succeeded), tuple(results), revision)
