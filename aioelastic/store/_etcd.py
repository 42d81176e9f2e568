"""A :class:`Store` on etcd v3, for jobs that must survive the loss of any one machine.

Theory of operation:

* **Layout.** A job's keys live under ``{prefix}kv/``; ``{prefix}ops/`` holds the markers of
  the exactly-once updates. etcd's revision is the store revision, so
  :meth:`EtcdStore.get_prefix` and :meth:`EtcdStore.wait_for_change` map onto a range read and a
  watch from ``after + 1``.
* **Parts.** This module maps the Store API onto them: the exactly-once read-modify-write
  (``add``, ``append``, ``compare_set``) is the pure :mod:`._etcd_txn`, driven here; waits are
  :mod:`._etcd_watch` (watches that fail over); leases (the session lease with its marker
  slots, TTL keys) are :mod:`._etcd_lease`; the counted writes (puts and a key count in one
  transaction, with their lost-reply recovery) :mod:`._etcd_counted`; events and statistics
  :mod:`._etcd_events`; the channels and the retry policy :mod:`._etcd_rpc`.
* **TTL keys** are attached to a lease of their own, granted with the TTL rounded up to whole
  seconds (etcd's unit; etcd also raises very short TTLs to its minimum, 2 s by default).
  Writing the key again with the same TTL renews that lease first; if the lease had already
  expired (so the key had expired), an :class:`EtcdLeaseLost` event reports it.
* **Failures.** Reads and idempotent writes retry with backoff, moving to the next endpoint; a
  wait re-opens its watch from the same revision on another member. A compacted revision ends a
  wait early: the caller re-reads.
* **Sharing.** Many handlers in one process may share a store: concurrent adds to one key are
  combined into one write, concurrent equal reads into one request (sent after each caller
  began, so reads stay linearizable), and equal waits into one watch (:mod:`._etcd_combine`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from aioelastic._service import Service
from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value, to_bytes
from aioelastic.store._errors import StoreClosedError, StoreOutcomeUnknownError, StoreTimeoutError
from aioelastic.store._etcd_combine import AddCombiner, CountedWrites, SharedCalls
from aioelastic.store._etcd_counted import CountedSender, snapshot
from aioelastic.store._etcd_events import (
    EtcdEvents,
    EtcdFailover,
    EtcdLeaseLost,
    EtcdStoreEvent,
    EtcdStoreStatistics,
)
from aioelastic.store._etcd_lease import SessionLease, TTLLeases, keepalive, time_to_live
from aioelastic.store._etcd_rpc import (
    EtcdConnection,
    Member,
    TLSConfig,
    decode_txn,
    encode_txn,
    first_kv,
    is_not_found,
    is_retryable,
    parse_endpoints,
    require_extra,
    rpc,
)
from aioelastic.store._etcd_txn import (
    Change,
    CheckLease,
    Done,
    Guess,
    KeyValue,
    Known,
    ReadKey,
    ReadMarker,
    Restart,
    Send,
    Step,
    Update,
    range_end,
)
from aioelastic.store._etcd_watch import Watches
from aioelastic.store._memory import check_key, check_ttl, parse_int

DEFAULT_PREFIX = "/aioelastic/default/"
ADD_GUESSES = 32
"""How many concurrent adds of the same amount by other clients one add transaction absorbs."""
COUNTED_OPS = 120
"""The most operations (puts and counts) one shared counted-write transaction holds: etcd's
default ``--max-txn-ops`` is 128."""
_LAST_WRITTEN_MAX = 4096
"""How many keys' last added values a store remembers (the guesses of blind adds)."""


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
        self._events = EtcdEvents(on_event)
        self._conn = EtcdConnection(
            addresses,
            tls=tls,
            user=user,
            password=password,
            request_timeout=request_timeout,
            retry_timeout=retry_timeout,
            on_failover=lambda address, detail: self._events.emit(EtcdFailover(address, detail)),
        )
        self._endpoint = f"etcd://{self._conn.endpoints}{self.prefix}"
        self._session = SessionLease(self._conn, session_ttl, self._session_lost)
        self._ttl_leases = TTLLeases(self._conn)
        self._tokens = itertools.count(1)
        self._adders: dict[bytes, AddCombiner] = {}
        self._counted: dict[bytes, CountedWrites] = {}
        self._counted_sender = CountedSender(self._conn, self._data, self._txn)
        self._last_written: dict[bytes, bytes] = {}  # key -> value of this store's last add
        closed = functools.partial(StoreClosedError, f"the etcd store {self._endpoint} closed")
        self._shared_reads: SharedCalls[Hashable, Any] = SharedCalls(
            join_running=False, closed=closed
        )
        self._watches = Watches(
            self._conn,
            probe_key=self._data,
            revision=self._revision,
            on_resumed=self._events.emit,
            closed=closed,
        )
        self._shared_tg: TaskGroup | None = None  # serve()'s, for the shared calls
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
            await self._session.start()
            async with anyio.create_task_group() as shared_tg:
                self._shared_tg = shared_tg
                task_status.started()
                while True:
                    await anyio.sleep(self._session.ttl / 3)
                    await self._session.renew(self._session.current)
        finally:
            self._serving = False
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(1):
                    await self._session.revoke()
                await self._conn.aclose()

    def _stop_serving(self, group: TaskGroup) -> None:
        self._closed = True  # a store is used once: leaving ``async with`` closes it
        super()._stop_serving(group)

    async def aclose(self) -> None:
        """Stop the keepalive task, revoke the session lease and close the channels (from
        any task: see :meth:`Service._close_service`)."""
        self._closed = True
        await self._close_service()

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
        return self._events.subscribe(callback)

    def statistics(self) -> EtcdStoreStatistics:
        """Return a snapshot of the connection, leases and failure counters."""
        session = self._session.current
        return EtcdStoreStatistics(
            endpoints=self._conn.endpoints,
            current_endpoint=self._conn.current_address,
            session_lease=session.lease if session is not None else None,
            ttl_leases=len(self._ttl_leases),
            failovers=self._events.failovers,
            leases_lost=self._events.leases_lost,
            watches_resumed=self._events.watches_resumed,
            outcome_checks=self._events.outcome_checks,
            requests=self._conn.requests,
        )

    def _session_lost(self, lease_id: int) -> None:
        detail = (
            "the session lease expired before it was renewed: "
            "writes that were in flight cannot be checked any more"
        )
        self._events.emit(EtcdLeaseLost(lease_id, None, detail))

    def _ttl_lease_lost(self, key: str, detail: str) -> Callable[[int], None]:
        return lambda lease_id: self._events.emit(EtcdLeaseLost(lease_id, key, detail))

    # -- reads -------------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return self._data + check_key(key).encode()

    async def _read(self, keys: Sequence[bytes]) -> tuple[int, list[KeyValue | None]]:
        """Return the revision and each key (None if missing), read atomically.

        Concurrent reads of the same keys share one request (sent after each of them began).
        """
        read = functools.partial(self._read_now, keys)
        result: tuple[int, list[KeyValue | None]] = await self._shared_reads.call(
            self._tasks(), ("read", *keys), read
        )
        return result

    async def _read_one(self, key: bytes) -> KeyValue | None:
        _, (kv,) = await self._read([key])
        return kv

    async def _read_now(self, keys: Sequence[bytes]) -> tuple[int, list[KeyValue | None]]:
        request = rpc.TxnRequest(
            success=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key)) for key in keys]
        )
        response = await self._txn("read", request)
        return response.header.revision, [first_kv(op.response_range) for op in response.responses]

    async def _range(self, prefix: bytes, *, count_only: bool = False) -> Any:
        """Read every key under ``prefix`` (concurrent equal reads share one request)."""
        request = rpc.RangeRequest(key=prefix, range_end=range_end(prefix), count_only=count_only)

        async def attempt(member: Member, timeout: float) -> Any:
            return await member.kv.Range(request, timeout=timeout, metadata=member.metadata)

        read = functools.partial(self._conn.call, "range read", attempt)
        return await self._shared_reads.call(self._tasks(), ("range", prefix, count_only), read)

    async def _revision(self) -> int:
        return int((await self._range(self._data, count_only=True)).header.revision)

    # -- writes ------------------------------------------------------------------------------

    async def _txn(self, what: str, request: Any, *, idempotent: bool = True) -> Any:
        async def attempt(member: Member, timeout: float) -> Any:
            return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)

        return await self._conn.call(what, attempt, idempotent=idempotent)

    async def _put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        put = rpc.PutRequest(key=key, value=value, lease=lease)
        await self._txn("write", rpc.TxnRequest(success=[rpc.RequestOp(request_put=put)]))

    async def _update(
        self,
        what: str,
        key: bytes,
        change: Change,
        *,
        guesses: int = 1,
        guess: Guess | None = None,
    ) -> tuple[bytes | None, bytes | None]:
        """Apply ``change`` to the value at ``key`` exactly once, keeping the key's lease.

        ``change(current)`` returns the new value, or None to write nothing. Returns the value
        written (None if nothing was) and the value read last. ``guesses > 1`` adds fallbacks
        for values other writers of the same change may have left (:mod:`._etcd_txn`).
        A ``guess`` of the value skips the first read: the first transaction starts from it,
        and reads the key back (in the same transaction) only if it and its fallbacks miss.
        """
        self._check_serving()
        known: Known = guess if guess is not None else await self._read_one(key)
        while True:
            session = await self._session.ensure()
            slot = session.take_slot()
            update = Update(
                key,
                change,
                known,
                marker=session.marker(self._ops, slot),
                lease=session.lease,
                marker_revision=session.revisions[slot],
                tokens=lambda: str(next(self._tokens)).encode(),
                guesses=guesses,
            )
            # A call that ends in an error or a cancellation may have left a transaction in
            # flight that lands later, so its slot is retired rather than given back.
            done = await self._drive(what, update, update.start())
            if done is None:  # the session lease was replaced, and nothing landed: start over
                known = await self._read_one(key)
                continue
            session.give_back(slot, update.marker_revision)
            return done.written, done.current

    async def _drive(self, what: str, update: Update, step: Step) -> Done | None:
        """Run ``update``'s steps against etcd until it is done (None: :class:`Restart`)."""
        lost: BaseException | None = None  # the error that cost the last reply
        while True:
            if isinstance(step, Done):
                return step
            if isinstance(step, Restart):
                return None
            if isinstance(step, ReadKey):
                step = update.key_read(await self._read_one(step.key))
            elif isinstance(step, ReadMarker):
                self._events.outcome_checks += 1
                step = update.marker_read(await self._read_one(step.key))
            elif isinstance(step, CheckLease):
                step = update.lease_checked(await keepalive(self._conn, step.lease) > 0)
            elif isinstance(step, Send):
                try:
                    response = await self._txn(what, encode_txn(step.txn), idempotent=False)
                except Exception as error:
                    if is_not_found(error):
                        # A lease is gone: the key's (it just expired) or the session's.
                        step = update.lease_missing(await self._session_survives(update.lease))
                        continue
                    if not is_retryable(error):
                        raise
                    self._conn.failover(self._conn.current, error)
                    lost = error
                    step = update.reply_lost()
                    continue
                step = update.received(decode_txn(response))
            else:
                name = update.key[len(self._data) :].decode(errors="replace")
                raise StoreOutcomeUnknownError(self._endpoint, what, name) from lost

    async def _session_survives(self, lease: int) -> bool:
        """After etcd found a lease missing: whether the session lease ``lease`` still lives
        (renewed, or found expired, reported and replaced)."""
        seen = self._session.current
        if seen is None or seen.lease != lease:
            return False
        await self._session.renew(seen)
        return self._session.current is seen

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
                return [kv.value for kv in kvs if kv is not None]
            with anyio.move_on_after(deadline - anyio.current_time()) as scope:
                fired = await self._watches.watch(
                    self._tasks(), [(k, b"") for k in missing], revision + 1
                )
                if len(full) == 1 and (value := fired.written.get(full[0])) is not None:
                    return [value]  # one key, and the watch brought its value: no read
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
            self._ttl_leases.forget(full)
            await self._put(full, data)
            return
        seconds = max(1, math.ceil(ttl))
        expired = self._ttl_lease_lost(key, "the key expired before it was written again")
        lease = await self._ttl_leases.lease_for(full, seconds, expired)
        try:
            await self._put(full, data, lease)
        except Exception as error:
            if not is_not_found(error):
                raise
            self._ttl_lease_lost(key, "the lease expired while it was written")(lease)
            await self._put(full, data, await self._ttl_leases.replace(full, seconds))

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

            # Start from the value this store last wrote there (or a missing key).
            guess = Guess(self._last_written.get(full))
            written, _ = await self._update("add", full, change, guesses=ADD_GUESSES, guess=guess)
            if written is not None:
                if len(self._last_written) >= _LAST_WRITTEN_MAX:
                    self._last_written.clear()
                self._last_written[full] = written
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

        # One transaction either way: it compares with the expected value itself, and reads the
        # key back in the same transaction when that differs.
        guess = Guess(expected_bytes or None)
        written, current = await self._update("compare_set", full, change, guess=guess)
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
        kv = await self._read_one(self._key(key))
        if kv is None or not kv.lease:
            return None
        ttl = await time_to_live(self._conn, kv.lease)
        return None if ttl is None else float(ttl)

    async def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed (after a lost reply and a retry, a key
        this call deleted may be reported as missing)."""
        full = self._key(key)
        self._check_serving()
        self._ttl_leases.forget(full)
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
            self._ttl_leases.forget(op.request_put.key)
        await self._txn("multi_set", rpc.TxnRequest(success=ops))

    @property
    def counts_keys(self) -> bool:
        return True

    async def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> int:
        """One transaction: the puts, then a count-only range read of ``prefix``, which sees
        them (etcd reads a transaction's own writes). No compare, so concurrent callers never
        conflict, and the key count stands in for a counter etcd cannot increment atomically.
        Concurrent calls on one prefix share a transaction (:class:`CountedWrites`), each
        count right after its own puts.

        A lost reply is recovered without counting twice: if the first key under ``prefix``
        holds its new value, the count is read at that key's revision (with a shared
        transaction, the writes after it in the same transaction count too); else the
        transaction is sent again.
        """
        count, _ = await self._counted_write("multi_set_and_count", keys, values, prefix, None)
        return count

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        """:meth:`multi_set_and_count` with a range read of ``read`` at the end of the same
        transaction (after a lost reply, read at the write's revision, as the count is)."""
        head = self._data + check_key(read).encode()
        count, snapshot = await self._counted_write(
            "multi_set_count_and_read", keys, values, prefix, head
        )
        assert snapshot is not None  # a write that asks to read gets a snapshot
        return count, snapshot

    async def _counted_write(
        self,
        what: str,
        keys: Sequence[str],
        values: Sequence[Value],
        prefix: str,
        read: bytes | None,
    ) -> tuple[int, Snapshot | None]:
        if len(keys) != len(values):
            raise ValueError(f"{what} got {len(keys)} keys but {len(values)} values")
        puts = {self._key(key): to_bytes(value) for key, value in zip(keys, values, strict=True)}
        head = self._data + check_key(prefix).encode()
        self._check_serving()
        for key in puts:
            self._ttl_leases.forget(key)
        writes = self._counted.setdefault(head, CountedWrites(COUNTED_OPS))
        try:
            send = functools.partial(self._counted_sender.send, head)
            return await writes.write_and_read(puts, send, read)
        finally:
            if not writes.users and self._counted.get(head) is writes:
                del self._counted[head]

    def _snapshot(self, revision: int, response_range: Any) -> Snapshot:
        return snapshot(self._data, revision, response_range)

    async def get_prefix(self, prefix: str) -> Snapshot:
        self._check_serving()
        response = await self._range(self._data + check_key(prefix).encode())
        return self._snapshot(int(response.header.revision), response)

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        """One transaction of range reads: every snapshot at one revision (concurrent equal
        reads share one request)."""
        self._check_serving()
        heads = [self._data + check_key(prefix).encode() for prefix in prefixes]
        request = rpc.TxnRequest()
        for head in heads:
            read = request.success.add().request_range
            read.key, read.range_end = head, range_end(head)
        read = functools.partial(self._txn, "range read", request)
        response = await self._shared_reads.call(self._tasks(), ("ranges", *heads), read)
        revision = int(response.header.revision)
        return [self._snapshot(revision, op.response_range) for op in response.responses]

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        self._check_serving()
        start = self._data + check_key(prefix).encode()
        resolved = self.resolve_timeout(timeout)
        end = range_end(start)
        with anyio.move_on_after(resolved):
            return (await self._watches.watch(self._tasks(), [(start, end)], after + 1)).revision
        # A watch replays history only after a short delay, so check it before giving up.
        revision = await self._watches.changed_since(start, end, after)
        if revision is not None:
            return revision
        raise StoreTimeoutError([f"{prefix}*"], resolved, self._endpoint)

    def __repr__(self) -> str:
        return f"EtcdStore({self._conn.endpoints!r}, prefix={self.prefix!r})"
