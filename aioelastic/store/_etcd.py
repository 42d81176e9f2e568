"""A :class:`Store` on etcd v3, for jobs that must survive the loss of any one machine.

Theory of operation:

* **Layout.** A job's keys live under ``{prefix}kv/``; ``{prefix}ops/`` holds the markers
  described below. etcd's revision is the store revision, so :meth:`EtcdStore.get_prefix`
  and :meth:`EtcdStore.wait_for_change` map onto a range read and a watch from ``after + 1``.
* **TTL keys** are attached to a lease of their own, granted with the TTL rounded up to whole
  seconds (etcd's unit; etcd also raises very short TTLs to its minimum, 2 s by default).
  Writing the key again with the same TTL renews that lease first; if the lease had already
  expired (so the key had expired), an :class:`EtcdLeaseLost` event reports it.
* **Exactly-once read-modify-write.** ``add``, ``append`` and ``compare_set`` read the key,
  then commit a transaction that requires the key to be unchanged and also writes a unique
  token to a marker key that only this operation uses (a *slot*, attached to the store's
  session lease, which a task in the store's task group keeps alive). When the reply of that
  transaction is lost, the marker says whether it was applied; every attempt also requires
  the marker to be unchanged, so a late-arriving attempt can never apply twice. A slot whose
  operation failed or was cancelled is retired (a transaction of it may still land). An ``add``
  transaction also carries fallbacks ("if the key now holds v+1, write v+2", ...), so adds
  racing from other clients land in one round instead of retrying one by one.
* **Failures.** Reads and idempotent writes retry with backoff, moving to the next endpoint;
  a wait re-opens its watch from the same revision on another member (aetcd's watch dies
  with its member). A compacted revision ends a wait early: the caller re-reads.
* **Sharing.** Many handlers in one process may share a store: concurrent adds to one key
  are combined into one write, concurrent equal reads into one request (sent after each
  caller began, so reads stay linearizable), and equal waits into one watch
  (:mod:`._etcd_combine`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from aioelastic._service import Service
from aioelastic._subscribers import Subscribers
from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value, to_bytes
from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreOutcomeUnknownError,
    StoreTimeoutError,
)
from aioelastic.store._etcd_combine import AddCombiner, SharedCalls
from aioelastic.store._etcd_rpc import (
    EtcdConnection,
    Member,
    TLSConfig,
    describe,
    grpc,
    is_not_found,
    is_retryable,
    is_rpc_error,
    parse_endpoints,
    require_extra,
    rpc,
    settle,
)
from aioelastic.store._memory import check_key, check_ttl, parse_int

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "/aioelastic/default/"
ADD_GUESSES = 32
"""How many concurrent adds of the same amount by other clients one add transaction absorbs."""


@dataclass(frozen=True, slots=True)
class EtcdLeaseLost:
    """A lease this store held expired before it was renewed; its keys were deleted.

    ``key`` is the TTL key that lease carried, or None for the store's session lease.
    """

    lease_id: int
    key: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class EtcdFailover:
    """A call to ``endpoint`` failed; the store moved on to the next endpoint."""

    endpoint: str
    detail: str


@dataclass(frozen=True, slots=True)
class EtcdWatchResumed:
    """A wait re-opened its watch from ``start_revision`` after its stream failed."""

    start_revision: int
    endpoint: str
    detail: str


EtcdStoreEvent = EtcdLeaseLost | EtcdFailover | EtcdWatchResumed


@dataclass(frozen=True, slots=True)
class EtcdStoreStatistics:
    """A snapshot of an :class:`EtcdStore`."""

    endpoints: str
    current_endpoint: str
    session_lease: int | None
    ttl_leases: int
    failovers: int
    leases_lost: int
    watches_resumed: int
    outcome_checks: int
    requests: int


class _Session:
    """The store's session lease and the marker slots attached to it.

    A slot is used by one read-modify-write at a time; ``revisions`` holds the mod revision of
    each slot's marker key (0 while it has none).
    """

    def __init__(self, lease: int) -> None:
        self.lease = lease
        self.revisions: dict[int, int] = {}
        self._free: list[int] = []

    def take_slot(self) -> int:
        slot = self._free.pop() if self._free else len(self.revisions)
        self.revisions.setdefault(slot, 0)
        return slot

    def give_back(self, slot: int) -> None:
        self._free.append(slot)


@dataclass(frozen=True, slots=True)
class _Guess:
    """What a key is believed to hold (None: missing) when it was not read first."""

    value: bytes | None


def _range_end(prefix: bytes) -> bytes:
    """The end of etcd's key range holding every key that starts with ``prefix``."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\0"


class EtcdStore(Service, Store):
    """A :class:`Store` kept in an etcd v3 cluster (asyncio only: its gRPC client is).

    ``endpoints`` is ``"host:port[,host:port...]"`` or a list; ``prefix`` separates jobs.
    TLS: ``ca_cert`` (and ``cert``/``key`` for a client certificate), PEM files; an
    ``https://`` endpoint with no CA uses the system's roots. ``user``/``password`` enable
    etcd authentication. ``request_timeout`` bounds one attempt; ``retry_timeout`` how long
    calls keep retrying (and waits tolerate an unreachable cluster) before
    :class:`StoreConnectionError`. Use as ``async with EtcdStore(...) as store:``.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] = "127.0.0.1:2379",
        *,
        prefix: str = DEFAULT_PREFIX,
        ca_cert: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        request_timeout: float = 5.0,
        retry_timeout: float = 30.0,
        session_ttl: int = 30,
        on_event: Callable[[EtcdStoreEvent], object] | None = None,
    ) -> None:
        require_extra()
        addresses, https = parse_endpoints(endpoints)
        if not prefix:
            raise ValueError("the etcd key prefix must not be empty; use e.g. '/aioelastic/job/'")
        if session_ttl < 3:
            raise ValueError(f"session_ttl must be at least 3 seconds, not {session_ttl!r}")
        self.timeout = self.resolve_timeout(timeout)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._data = f"{self.prefix}kv/".encode()
        self._ops = f"{self.prefix}ops/".encode()
        tls = None
        if https or ca_cert is not None or cert is not None:
            tls = TLSConfig(ca_cert, cert, key)
        self._conn = EtcdConnection(
            addresses,
            tls=tls,
            user=user,
            password=password,
            request_timeout=request_timeout,
            retry_timeout=retry_timeout,
            on_failover=lambda address, detail: self._emit(EtcdFailover(address, detail)),
        )
        self._endpoint = f"etcd://{self._conn.endpoints}{self.prefix}"
        self._session_ttl = session_ttl
        self._session: _Session | None = None
        self._session_lock = anyio.Lock()
        self._tokens = itertools.count(1)
        self._ttl_leases: dict[bytes, tuple[int, int]] = {}  # key -> (lease id, seconds)
        self._adders: dict[bytes, AddCombiner] = {}
        self._last_written: dict[bytes, bytes] = {}  # key -> value of this store's last add
        closed = functools.partial(StoreClosedError, f"the etcd store {self._endpoint} closed")
        self._shared_reads: SharedCalls[Hashable, Any] = SharedCalls(
            join_running=False, closed=closed
        )
        self._shared_watches: SharedCalls[Hashable, int] = SharedCalls(
            join_running=True, closed=closed
        )
        self._shared_tg: TaskGroup | None = None  # serve()'s, for the shared calls
        self._subscribers: Subscribers[EtcdStoreEvent] = Subscribers(
            logger, "etcd store event", on_event
        )
        self._counts = {"failovers": 0, "leases_lost": 0, "resumed": 0, "checks": 0}
        self._serving = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return self._endpoint

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, grant the session lease, report ready, then keep the lease alive.

        Runs until cancelled, then revokes the lease and closes the channels; this is what
        ``async with store:`` runs in the store's own task group.
        """
        self._check_open()
        if self._serving:
            raise RuntimeError(f"{self!r} is already open")
        self._conn.open()
        self._serving = True
        try:
            await self._new_session()
            async with anyio.create_task_group() as shared_tg:
                self._shared_tg = shared_tg
                task_status.started()
                while True:
                    await anyio.sleep(self._session_ttl / 3)
                    await self._renew_session(self._session)
        finally:
            self._serving = False
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(1):
                    await self._revoke_session()
                await self._conn.aclose()

    def _stop_serving(self, group: TaskGroup) -> None:
        self._closed = True  # a store is used once: leaving ``async with`` closes it
        super()._stop_serving(group)

    async def aclose(self) -> None:
        """Stop the keepalive task, revoke the session lease and close the channels."""
        self._closed = True
        if self._service_group is not None:
            await Service.__aexit__(self, None, None, None)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the etcd store {self._endpoint} was closed; create a new one")
        if not self._serving and self._service_group is not None:
            raise StoreClosedError(f"the etcd store {self._endpoint} stopped serving")

    def _tasks(self) -> TaskGroup:
        """The task group of :meth:`serve`, where shared calls run."""
        if self._shared_tg is None or not self._serving:
            self._check_serving()
            raise StoreClosedError(f"the etcd store {self._endpoint} is not serving")
        return self._shared_tg

    def _check_serving(self) -> None:
        self._check_open()
        if not self._serving:
            raise StoreClosedError(
                f"the etcd store {self._endpoint} is not open: use "
                "`async with EtcdStore(...) as store:` or `await task_group.start(store.serve)`"
            )

    # -- events ------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[EtcdStoreEvent], object]) -> Callable[[], None]:
        """Call ``callback`` with every event; return a function that unsubscribes it."""
        return self._subscribers.add(callback)

    def _emit(self, event: EtcdStoreEvent) -> None:
        if isinstance(event, EtcdLeaseLost):
            self._counts["leases_lost"] += 1
            logger.warning("etcd lease %x lost (%s): %s", event.lease_id, event.key, event.detail)
        elif isinstance(event, EtcdFailover):
            self._counts["failovers"] += 1
            logger.info("etcd endpoint %s failed: %s", event.endpoint, event.detail)
        else:
            self._counts["resumed"] += 1
        self._subscribers.emit(event)

    def statistics(self) -> EtcdStoreStatistics:
        """Return a snapshot of the connection, leases and failure counters."""
        return EtcdStoreStatistics(
            endpoints=self._conn.endpoints,
            current_endpoint=self._conn.current_address,
            session_lease=self._session.lease if self._session is not None else None,
            ttl_leases=len(self._ttl_leases),
            failovers=self._counts["failovers"],
            leases_lost=self._counts["leases_lost"],
            watches_resumed=self._counts["resumed"],
            outcome_checks=self._counts["checks"],
            requests=self._conn.requests,
        )

    # -- leases ------------------------------------------------------------------------------

    async def _grant(self, seconds: int) -> int:
        lease_id = random.getrandbits(62) or 1
        attempts = 0

        async def attempt(member: Member, timeout: float) -> None:
            nonlocal attempts
            attempts += 1
            try:
                await member.lease.LeaseGrant(
                    rpc.LeaseGrantRequest(ID=lease_id, TTL=seconds),
                    timeout=timeout,
                    metadata=member.metadata,
                )
            except Exception as error:
                # A retry finding the lease means an earlier attempt was granted.
                if attempts > 1 and "lease already exists" in describe(error):
                    return
                raise

        await self._conn.call("grant lease", attempt)
        return lease_id

    async def _keepalive(self, lease_id: int) -> int:
        """Renew ``lease_id``; return its TTL now (0 when the lease no longer exists)."""

        async def attempt(member: Member, timeout: float) -> int:
            call = member.lease.LeaseKeepAlive(metadata=member.metadata, timeout=timeout)
            try:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                response = await call.read()
            finally:
                call.cancel()
            if response is grpc.aio.EOF:
                raise StoreConnectionError(member.address, "lease keepalive stream ended")
            ttl: int = response.TTL
            return ttl

        return await self._conn.call("renew lease", attempt)

    async def _new_session(self) -> _Session:
        self._session = _Session(await self._grant(self._session_ttl))
        return self._session

    async def _renew_session(self, seen: _Session | None) -> None:
        """Renew the session lease ``seen``; when it is gone, report it and start a new one.

        Does nothing if another task already replaced ``seen``.
        """
        async with self._session_lock:
            if self._session is not seen:
                return
            try:
                if seen is not None and await self._keepalive(seen.lease) > 0:
                    return
            except StoreError as error:
                logger.warning("cannot renew the etcd session lease: %s", error)
                return
            self._session = None
            if seen is not None:
                self._emit(
                    EtcdLeaseLost(
                        seen.lease,
                        None,
                        "the session lease expired before it was renewed: "
                        "writes that were in flight cannot be checked any more",
                    )
                )
            try:
                await self._new_session()
            except StoreError as error:
                logger.warning("cannot start a new etcd session: %s", error)

    async def _revoke_session(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        member = self._conn.current
        try:
            await settle(
                member.lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=session.lease),
                    timeout=self._conn.request_timeout,
                    metadata=member.metadata,
                )
            )
        except Exception as error:
            if not is_rpc_error(error):
                raise
            logger.info("etcd session lease %x not revoked (%s); it expires", session.lease, error)

    # -- reads -------------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return self._data + check_key(key).encode()

    async def _read(self, keys: Sequence[bytes]) -> tuple[int, list[Any]]:
        """Return the revision and each key's KeyValue (None if missing), read atomically.

        Concurrent reads of the same keys share one request (sent after each of them began).
        """
        read = functools.partial(self._read_now, keys)
        result: tuple[int, list[Any]] = await self._shared_reads.call(
            self._tasks(), ("read", *keys), read
        )
        return result

    async def _read_now(self, keys: Sequence[bytes]) -> tuple[int, list[Any]]:
        request = rpc.TxnRequest(
            success=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key)) for key in keys]
        )

        async def attempt(member: Member, timeout: float) -> Any:
            return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)

        response = await self._conn.call("read", attempt)
        values = [
            (op.response_range.kvs[0] if op.response_range.kvs else None)
            for op in response.responses
        ]
        return response.header.revision, values

    async def _range(self, prefix: bytes, *, count_only: bool = False) -> Any:
        """Read every key under ``prefix`` (concurrent equal reads share one request)."""
        request = rpc.RangeRequest(key=prefix, range_end=_range_end(prefix), count_only=count_only)

        async def attempt(member: Member, timeout: float) -> Any:
            return await member.kv.Range(request, timeout=timeout, metadata=member.metadata)

        read = functools.partial(self._conn.call, "range read", attempt)
        return await self._shared_reads.call(self._tasks(), ("range", prefix, count_only), read)

    # -- writes ------------------------------------------------------------------------------

    async def _txn(self, what: str, request: Any) -> Any:
        async def attempt(member: Member, timeout: float) -> Any:
            return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)

        return await self._conn.call(what, attempt)

    async def _put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        await self._txn(
            "write",
            rpc.TxnRequest(
                success=[
                    rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
                ]
            ),
        )

    async def _update(
        self,
        what: str,
        key: bytes,
        change: Callable[[bytes | None], bytes | None],
        guesses: int = 1,
        blind: bool = False,
    ) -> tuple[bytes | None, bytes | None]:
        """Apply ``change`` to the value at ``key`` exactly once, keeping the key's lease.

        ``change(current)`` returns the new value, or None to write nothing. Returns the value
        written (None if nothing was) and the value read last. With ``guesses > 1`` the
        transaction also carries fallbacks for values other writers may have written in the
        meantime (``change`` applied again), so contending writers of the same change (adds
        of one amount) all succeed in one round instead of one per round. ``blind`` skips the
        first read: the first transaction starts from the value this store last wrote there
        (or a missing key), and reads the key back only if that guess and its fallbacks miss.
        """
        self._check_serving()
        if blind:
            kv: Any = _Guess(self._last_written.get(key))
        else:
            _, (kv,) = await self._read([key])
        while True:
            session = self._session
            if session is None:
                async with self._session_lock:
                    if self._session is None:
                        await self._new_session()
                continue
            slot = session.take_slot()
            # A call that ends in an error or a cancellation may have left a transaction in
            # flight that lands later, so its slot is retired rather than given back.
            outcome = await self._update_in_slot(what, key, change, guesses, kv, session, slot)
            session.give_back(slot)
            if outcome is not None:
                if outcome[0] is not None and blind:
                    if len(self._last_written) >= 4096:
                        self._last_written.clear()
                    self._last_written[key] = outcome[0]
                return outcome
            _, (kv,) = await self._read([key])  # the session was replaced: start over

    async def _update_in_slot(
        self,
        what: str,
        key: bytes,
        change: Callable[[bytes | None], bytes | None],
        guesses: int,
        kv: Any,
        session: _Session,
        slot: int,
    ) -> tuple[bytes | None, bytes | None] | None:
        """:meth:`_update` with one marker slot; None when the session lease vanished."""
        marker = self._ops + f"{session.lease:x}/{slot}".encode()
        written: dict[bytes, bytes] = {}  # marker token -> the value that branch writes
        while True:
            current = kv.value if kv is not None else None
            values = _chain(change, current, guesses)
            if not values:
                return None, current
            tokens = [f"{next(self._tokens)}".encode() for _ in values]
            written.update(zip(tokens, values, strict=True))
            request = _update_request(key, kv, values, marker, session, slot, tokens)
            try:
                response = await self._conn.call(what, _txn_attempt(request), idempotent=False)
            except Exception as error:
                if is_not_found(error):
                    # A lease is gone: the key's (it just expired) or the session's.
                    await self._renew_session(session)
                    if self._session is not session:
                        return None
                    _, (kv,) = await self._read([key])
                    continue
                if not is_retryable(error):
                    raise
                self._conn.failover(self._conn.current, error)
                applied = await self._check_marker(what, key, marker, session, slot, written, error)
                if applied is not None:
                    return applied, applied
                _, (kv,) = await self._read([key])
                continue
            if response.succeeded:  # the marker was as expected: walk down the branches
                branch = response.responses[0].response_txn
                for value in values:
                    if branch.succeeded:
                        session.revisions[slot] = response.header.revision
                        return value, value
                    op = branch.responses[0]
                    if op.HasField("response_range"):
                        kvs = op.response_range.kvs
                        kv = kvs[0] if kvs else None
                        break
                    branch = op.response_txn
                continue
            key_kvs = response.responses[0].response_range.kvs
            marker_kvs = response.responses[1].response_range.kvs
            if marker_kvs and marker_kvs[0].value in written:
                # An attempt whose reply was lost has landed since.
                session.revisions[slot] = marker_kvs[0].mod_revision
                value = written[marker_kvs[0].value]
                return value, value
            # Not our marker, and every attempt of this call is known not to have applied: what
            # changed the marker (a write of an earlier call whose reply this store never saw,
            # the session lease's expiry) is history. Compare with the marker as it is now;
            # comparing with the revision it had would fail forever.
            session.revisions[slot] = marker_kvs[0].mod_revision if marker_kvs else 0
            kv = key_kvs[0] if key_kvs else None

    async def _check_marker(
        self,
        what: str,
        key: bytes,
        marker: bytes,
        session: _Session,
        slot: int,
        written: dict[bytes, bytes],
        error: BaseException,
    ) -> bytes | None:
        """After a lost reply, return the value that attempt wrote, or None if it did not."""
        self._counts["checks"] += 1
        _, (found,) = await self._read([marker])
        if found is not None:
            if found.value in written:
                session.revisions[slot] = found.mod_revision
                return bytes(written[found.value])
            return None
        # No marker is conclusive only while the session lease (which holds markers) lives.
        if session.revisions[slot] == 0 and await self._keepalive(session.lease) > 0:
            return None
        # The session lease (and with it the marker) expired: the outcome cannot be known.
        raise StoreOutcomeUnknownError(
            self._endpoint, what, key[len(self._data) :].decode(errors="replace")
        ) from error

    # -- waits -------------------------------------------------------------------------------

    async def _watch(self, ranges: Sequence[tuple[bytes, bytes]], start_revision: int) -> int:
        """Return the store revision once a key in ``ranges`` changes at ``start_revision``
        or later (or that history was compacted); concurrent equal waits share one watch.
        """
        key = (tuple(ranges), start_revision)
        watch = functools.partial(self._watch_now, ranges, start_revision)
        revision: int = await self._shared_watches.call(self._tasks(), key, watch)
        return revision

    async def _watch_now(self, ranges: Sequence[tuple[bytes, bytes]], start_revision: int) -> int:
        """:meth:`_watch` for one caller, re-watching on another member on failure."""
        failing_since: float | None = None
        delay = 0.05

        def established() -> None:
            nonlocal failing_since, delay
            failing_since, delay = None, 0.05

        while True:
            member = self._conn.current
            try:
                revision = await settle(self._watch_on(member, ranges, start_revision, established))
            except Exception as error:
                if is_rpc_error(error) and not is_retryable(error):
                    raise self._conn.rejected(member, "watch", error) from None
                if not is_rpc_error(error) and not isinstance(error, StoreConnectionError):
                    raise
                self._conn.failover(member, error)
                now = anyio.current_time()
                failing_since = now if failing_since is None else failing_since
                if now + delay > failing_since + self._conn.retry_timeout:
                    raise self._conn.unreachable("watch", error) from None
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
                self._emit(
                    EtcdWatchResumed(start_revision, self._conn.current_address, describe(error))
                )
            else:
                # None: the history from start_revision was compacted; wake up, callers re-read.
                return revision if revision is not None else await self._revision()

    async def _watch_on(
        self,
        member: Member,
        ranges: Sequence[tuple[bytes, bytes]],
        start_revision: int,
        established: Callable[[], None],
    ) -> int | None:
        """Watch ``ranges`` on ``member`` while probing that it still answers.

        A stalled member (paused, or cut off) keeps its stream open and silent, and grpc's
        keepalive may take a minute to notice; the probe notices within two request timeouts.
        """
        await self._conn.authenticate(member)
        # "hasleader": etcd ends the watch if this member loses its leader (no stale waits).
        self._conn.requests += 1
        call = member.watch.Watch(metadata=(*(member.metadata or ()), ("hasleader", "true")))
        ended: list[int | Exception | None] = []  # the first of: the watch's result, a failure

        async def first(step: Awaitable[int | None]) -> None:
            try:
                ended.append(await step)
            except Exception as error:  # raised below, not as an exception group
                ended.append(error)
            tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    first, self._read_watch(call, member, ranges, start_revision, established)
                )
                tg.start_soon(first, self._probe(member))
        finally:
            call.cancel()
        outcome = ended[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _read_watch(
        self,
        call: Any,
        member: Member,
        ranges: Sequence[tuple[bytes, bytes]],
        start_revision: int,
        established: Callable[[], None],
    ) -> int | None:
        for key, end in ranges:
            create = rpc.WatchCreateRequest(key=key, range_end=end, start_revision=start_revision)
            await settle(call.write(rpc.WatchRequest(create_request=create)))
        while True:
            response = await settle(call.read())
            if response is grpc.aio.EOF:
                raise StoreConnectionError(member.address, "the watch stream ended")
            if response.compact_revision:
                return None
            if response.events:
                return int(response.header.revision)
            if response.canceled:
                raise StoreConnectionError(
                    member.address, f"etcd cancelled the watch: {response.cancel_reason}"
                )
            if response.created:
                established()

    async def _probe(self, member: Member) -> int | None:
        """Raise :class:`StoreConnectionError` once ``member`` stops answering a small read
        (one every request timeout); never returns otherwise."""
        request = rpc.RangeRequest(key=self._data, keys_only=True)
        timeout = self._conn.request_timeout
        while True:
            await anyio.sleep(timeout)
            self._conn.requests += 1
            try:
                await settle(member.kv.Range(request, timeout=timeout, metadata=member.metadata))
            except Exception as error:
                if is_retryable(error):
                    raise StoreConnectionError(
                        member.address,
                        f"stopped answering while it held a watch ({describe(error)})",
                    ) from None
                if not is_rpc_error(error):
                    raise
                # Refused rather than stalled (an expired token, say): the watch decides.

    async def _changed_since(self, start: bytes, end: bytes, after: int) -> int | None:
        """Return the store revision if a key in ``[start, end)`` changed after ``after``."""
        # (etcd's count ignores the revision filters, so read keys instead of counting)
        changed = rpc.RangeRequest(
            key=start, range_end=end, keys_only=True, min_mod_revision=after + 1
        )
        now = rpc.RangeRequest(key=start, range_end=end, keys_only=True)
        then = rpc.RangeRequest(key=start, range_end=end, keys_only=True, revision=after)
        request = rpc.TxnRequest(
            success=[rpc.RequestOp(request_range=op) for op in (changed, now, then)]
        )

        async def attempt(member: Member, timeout: float) -> Any:
            try:
                return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                # "compacted": history is gone, report a change (callers re-read);
                # "future revision": nothing can have changed after it yet.
                return "compacted" in (error.details() or "")

        response = await self._conn.call("read", attempt)
        if isinstance(response, bool):
            return await self._revision() if response else None
        modified, current, previous = (op.response_range for op in response.responses)
        deleted = {kv.key for kv in previous.kvs} - {kv.key for kv in current.kvs}
        return int(response.header.revision) if modified.kvs or deleted else None

    async def _revision(self) -> int:
        return int((await self._range(self._data, count_only=True)).header.revision)

    async def _wait_present(self, keys: Sequence[str], timeout: float | None) -> list[bytes]:
        """Return the values of ``keys`` once all exist, watching the missing ones."""
        names = list(keys)
        full = [self._key(key) for key in names]
        resolved = self.resolve_timeout(timeout)
        self._check_serving()
        deadline = anyio.current_time() + resolved
        revision, kvs = await self._read(full)
        while True:
            missing = [k for k, kv in zip(full, kvs, strict=True) if kv is None]
            if not missing:
                return [bytes(kv.value) for kv in kvs]
            with anyio.move_on_after(deadline - anyio.current_time()) as scope:
                await self._watch([(k, b"") for k in missing], revision + 1)
            revision, kvs = await self._read(full)
            if scope.cancelled_caught and any(kv is None for kv in kvs):
                break
        absent = [name for name, k in zip(names, full, strict=True) if k in missing]
        raise StoreTimeoutError(absent, resolved, self._endpoint)

    # -- the Store API -----------------------------------------------------------------------

    async def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        full, data = self._key(key), to_bytes(value)
        check_ttl(ttl)
        self._check_serving()
        if ttl is None:
            self._ttl_leases.pop(full, None)
            await self._put(full, data)
            return
        seconds = max(1, math.ceil(ttl))
        lease = self._ttl_leases.get(full)
        if lease is not None and lease[1] == seconds and await self._keepalive(lease[0]) <= 0:
            self._emit(EtcdLeaseLost(lease[0], key, "the key expired before it was written again"))
            lease = None
        if lease is None or lease[1] != seconds:
            lease = (await self._grant(seconds), seconds)
        try:
            await self._put(full, data, lease[0])
        except Exception as error:
            if not is_not_found(error):
                raise
            self._emit(EtcdLeaseLost(lease[0], key, "the lease expired while it was written"))
            lease = (await self._grant(seconds), seconds)
            await self._put(full, data, lease[0])
        self._ttl_leases[full] = lease

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        (value,) = await self._wait_present([key], timeout)
        return value

    async def add(self, key: str, amount: int) -> int:
        if not isinstance(amount, int):
            raise TypeError(f"add amount must be an int, not {type(amount).__name__}")
        full = self._key(key)

        async def apply(total: int) -> int:
            def change(current: bytes | None) -> bytes:
                base = parse_int(key, current) if current is not None else 0
                return str(base + total).encode()

            written, _ = await self._update("add", full, change, ADD_GUESSES, blind=True)
            return int(written or b"0")

        combiner = self._adders.setdefault(full, AddCombiner())
        try:
            return await combiner.add(
                amount, apply, lambda: StoreOutcomeUnknownError(self._endpoint, "add", key)
            )
        finally:
            if not combiner.users and self._adders.get(full) is combiner:
                del self._adders[full]

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        full = self._key(key)
        expected_bytes, desired_bytes = to_bytes(expected), to_bytes(desired)

        def change(current: bytes | None) -> bytes | None:
            if (current is None and not expected_bytes) or current == expected_bytes:
                return desired_bytes
            return None

        written, current = await self._update("compare_set", full, change)
        if written is not None:
            return written
        return current if current is not None else expected_bytes

    async def append(self, key: str, value: Value) -> None:
        full, data = self._key(key), to_bytes(value)
        await self._update("append", full, lambda current: (current or b"") + data)

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self._wait_present(keys, timeout)

    async def check(self, keys: Sequence[str]) -> bool:
        self._check_serving()
        _, kvs = await self._read([self._key(key) for key in keys])
        return all(kv is not None for kv in kvs)

    async def ttl_remaining(self, key: str) -> float | None:
        """The key's lease's time to live, in whole seconds as etcd counts them.

        The lease is read from the key itself, so this works for keys other clients wrote.
        """
        self._check_serving()
        _, (kv,) = await self._read([self._key(key)])
        if kv is None or not kv.lease:
            return None
        request = rpc.LeaseTimeToLiveRequest(ID=kv.lease)

        async def attempt(member: Member, timeout: float) -> int:
            response = await member.lease.LeaseTimeToLive(
                request, timeout=timeout, metadata=member.metadata
            )
            ttl: int = response.TTL
            return ttl

        try:
            ttl = await self._conn.call("read lease time to live", attempt)
        except Exception as error:
            if is_not_found(error):
                return None  # the lease expired since the key was read
            raise
        return None if ttl < 0 else float(ttl)

    async def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed (after a lost reply and a retry, a key
        this call deleted may be reported as missing)."""
        full = self._key(key)
        self._check_serving()
        self._ttl_leases.pop(full, None)
        request = rpc.DeleteRangeRequest(key=full)

        async def attempt(member: Member, timeout: float) -> Any:
            return await member.kv.DeleteRange(request, timeout=timeout, metadata=member.metadata)

        response = await self._conn.call("delete", attempt)
        return bool(response.deleted)

    async def num_keys(self) -> int:
        self._check_serving()
        return int((await self._range(self._data, count_only=True)).count)

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        return await self._wait_present(keys, timeout)

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        ops = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(key), value=to_bytes(value)))
            for key, value in zip(keys, values, strict=True)
        ]
        self._check_serving()
        if not ops:
            return
        for op in ops:
            self._ttl_leases.pop(op.request_put.key, None)
        await self._txn("multi_set", rpc.TxnRequest(success=ops))

    async def get_prefix(self, prefix: str) -> Snapshot:
        self._check_serving()
        response = await self._range(self._data + check_key(prefix).encode())
        cut = len(self._data)
        items = {kv.key[cut:].decode(): kv.value for kv in response.kvs}
        return Snapshot(int(response.header.revision), items)

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        self._check_serving()
        start = self._data + check_key(prefix).encode()
        resolved = self.resolve_timeout(timeout)
        end = _range_end(start)
        with anyio.move_on_after(resolved):
            return await self._watch([(start, end)], after + 1)
        # A watch replays history only after a short delay, so check it before giving up.
        revision = await self._changed_since(start, end, after)
        if revision is not None:
            return revision
        raise StoreTimeoutError([f"{prefix}*"], resolved, self._endpoint)

    def __repr__(self) -> str:
        return f"EtcdStore({self._conn.endpoints!r}, prefix={self.prefix!r})"


def _chain(
    change: Callable[[bytes | None], bytes | None], current: bytes | None, length: int
) -> list[bytes]:
    """``change(current)``, then ``change`` of that, ...: up to ``length`` values to write."""
    values: list[bytes] = []
    value = current
    while len(values) < length:
        next_value = change(value)
        if next_value is None:
            break
        values.append(next_value)
        value = next_value
    return values


def _update_request(
    key: bytes,
    kv: Any,
    values: Sequence[bytes],
    marker: bytes,
    session: _Session,
    slot: int,
    tokens: Sequence[bytes],
) -> Any:
    """The transaction of one read-modify-write attempt (see the module docstring).

    If the marker is unchanged, branch 0 writes ``values[0]`` if the key is still as read
    (same mod revision, keeping its lease) or, for a :class:`_Guess`, holds the guessed
    value (or is missing); otherwise branch ``i`` writes ``values[i]`` if
    the key now holds ``values[i - 1]`` (keeping whatever lease it has); each branch also
    writes its own token to the marker. When no branch applies, the key is read back.
    """

    def put(name: bytes, data: bytes, lease: int = 0, ignore_lease: bool = False) -> Any:
        request = rpc.PutRequest(key=name, value=data, lease=lease, ignore_lease=ignore_lease)
        return rpc.RequestOp(request_put=request)

    def read(name: bytes) -> Any:
        return rpc.RequestOp(request_range=rpc.RangeRequest(key=name))

    def same_mod(name: bytes, revision: int) -> Any:
        return rpc.Compare(
            key=name, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=revision
        )

    def holds(value: bytes) -> Any:  # fails on a missing key
        return rpc.Compare(key=key, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=value)

    otherwise = [read(key)]
    for i in reversed(range(len(values))):
        if i == 0 and isinstance(kv, _Guess) and kv.value is not None:
            compare, write = holds(kv.value), put(key, values[0], ignore_lease=True)
        elif i == 0:
            known = kv is not None and not isinstance(kv, _Guess)
            compare = same_mod(key, kv.mod_revision if known else 0)
            write = put(key, values[0], lease=kv.lease if known else 0)
        else:
            compare, write = holds(values[i - 1]), put(key, values[i], ignore_lease=True)
        branch = rpc.TxnRequest(
            compare=[compare],
            success=[write, put(marker, tokens[i], session.lease)],
            failure=otherwise,
        )
        otherwise = [rpc.RequestOp(request_txn=branch)]
    return rpc.TxnRequest(
        compare=[same_mod(marker, session.revisions[slot])],
        success=otherwise,
        failure=[read(key), read(marker)],
    )


def _txn_attempt(request: Any) -> Callable[[Member, float], Awaitable[Any]]:
    async def attempt(member: Member, timeout: float) -> Any:
        return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)

    return attempt
