"""Waiting on etcd for :class:`~aioelastic.store.EtcdStore`: watches that survive their member.

A wait is a watch from a revision; concurrent equal waits share one watch (:class:`SharedCalls`,
run in the store's task group). aetcd's watch dies with the member holding its stream, and a
stalled member (paused, or cut off) keeps its stream open and silent, so each watch runs beside
a probe: a small read every request timeout, which fails once the member stops answering. On
either failure the watch is re-opened from the same revision on the next member, with backoff,
until the members have failed for the retry budget. A compacted start revision ends the wait
early (the caller re-reads). A watch replays history only after a short delay, so a wait that
timed out checks the history with one read before it gives up (:meth:`Watches.changed_since`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from aioelastic._concurrency import first_of
from aioelastic.store._errors import StoreConnectionError
from aioelastic.store._etcd_combine import SharedCalls
from aioelastic.store._etcd_events import EtcdWatchResumed
from aioelastic.store._etcd_rpc import (
    EtcdConnection,
    Member,
    describe,
    grpc,
    is_retryable,
    is_rpc_error,
    rpc,
    settle,
)

Ranges = Sequence[tuple[bytes, bytes]]
"""Key ranges ``(start, end)``; an empty ``end`` is the single key ``start``."""


@dataclass(frozen=True, slots=True)
class Fired:
    """How a watch ended: the store revision, and what the first batch of events left in the
    keys it wrote (key -> value; a key deleted after its write is absent), so a caller waiting
    for one key to appear has its value without reading it again."""

    revision: int
    written: Mapping[bytes, bytes] = field(default_factory=dict)


class Watches:
    """Shared, failing-over watches on ``conn``.

    ``probe_key`` is read (keys only) to tell a live member from a stalled one; ``revision()``
    returns the store revision now; ``on_resumed`` hears of each watch re-opened after a failure.
    """

    def __init__(
        self,
        conn: EtcdConnection,
        *,
        probe_key: bytes,
        revision: Callable[[], Awaitable[int]],
        on_resumed: Callable[[EtcdWatchResumed], None],
        closed: Callable[[], BaseException],
    ) -> None:
        self._conn = conn
        self._probe_request = rpc.RangeRequest(key=probe_key, keys_only=True)
        self._revision = revision
        self._on_resumed = on_resumed
        self._shared: SharedCalls[Hashable, Fired] = SharedCalls(join_running=True, closed=closed)

    async def watch(self, task_group: TaskGroup, ranges: Ranges, start_revision: int) -> Fired:
        """Return once a key in ``ranges`` changes at ``start_revision`` or later (or that
        history was compacted: then with nothing written); concurrent equal waits share one
        watch, which runs in ``task_group``."""
        key = (tuple(ranges), start_revision)
        watch = functools.partial(self._watch_failing_over, ranges, start_revision)
        return await self._shared.call(task_group, key, watch)

    async def _watch_failing_over(self, ranges: Ranges, start_revision: int) -> Fired:
        """:meth:`watch` for one caller, re-watching on another member on failure."""
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
                self._on_resumed(
                    EtcdWatchResumed(start_revision, self._conn.current_address, describe(error))
                )
            else:
                # None: the history from start_revision was compacted; wake up, callers re-read.
                return revision if revision is not None else Fired(await self._revision())

    async def _watch_on(
        self,
        member: Member,
        ranges: Ranges,
        start_revision: int,
        established: Callable[[], None],
    ) -> Fired | None:
        """Watch ``ranges`` on ``member`` while probing that it still answers.

        A stalled member keeps its stream open and silent, and grpc's keepalive may take a
        minute to notice; the probe notices within two request timeouts.
        """
        await self._conn.authenticate(member)
        # "hasleader": etcd ends the watch if this member loses its leader (no stale waits).
        self._conn.requests += 1
        call = member.watch.Watch(metadata=(*(member.metadata or ()), ("hasleader", "true")))
        try:
            return await first_of(
                functools.partial(
                    _read_watch,
                    call,
                    member,
                    ranges,
                    start_revision,
                    established,
                    self._changed_in_gap,
                ),
                functools.partial(self._probe, member),
            )
        finally:
            call.cancel()

    async def _probe(self, member: Member) -> Fired | None:
        """Raise :class:`StoreConnectionError` once ``member`` stops answering a small read
        (one every request timeout); never returns otherwise."""
        timeout = self._conn.request_timeout
        while True:
            await anyio.sleep(timeout)
            self._conn.requests += 1
            try:
                await settle(
                    member.kv.Range(self._probe_request, timeout=timeout, metadata=member.metadata)
                )
            except Exception as error:
                if is_retryable(error):
                    raise StoreConnectionError(
                        member.address,
                        f"stopped answering while it held a watch ({describe(error)})",
                    ) from None
                if not is_rpc_error(error):
                    raise
                # Refused rather than stalled (an expired token, say): the watch decides.

    async def _changed_in_gap(self, ranges: Ranges, after: int) -> int | None:
        """The store revision if a key in ``ranges`` changed after ``after`` (one read per
        range), else None: what a watch created later than ``after`` cannot report."""
        for start, end in ranges:
            revision = await self.changed_since(start, end, after)
            if revision is not None:
                return revision
        return None

    async def changed_since(self, start: bytes, end: bytes, after: int) -> int | None:
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


async def _read_watch(
    call: Any,
    member: Member,
    ranges: Ranges,
    start_revision: int,
    established: Callable[[], None],
    changed_in_gap: Callable[[Ranges, int], Awaitable[int | None]],
) -> Fired | None:
    """Watch ``ranges`` for changes from ``start_revision``: from now, then one read for the
    changes before the watch began (if any could be).

    Not from ``start_revision`` itself: etcd serves a watch that starts in the past (any write
    since the caller's read makes it so) from a catch-up loop that runs every 100 ms, so it
    would hear even a later change up to 100 ms late. A watch from now is served at once, and
    its creation reports the revision it starts after.
    """
    for key, end in ranges:
        create = rpc.WatchCreateRequest(key=key, range_end=end)
        await settle(call.write(rpc.WatchRequest(create_request=create)))
    created = 0
    while True:
        response = await settle(call.read())
        if response is grpc.aio.EOF:
            raise StoreConnectionError(member.address, "the watch stream ended")
        if response.compact_revision:
            return None
        if response.events:
            written: dict[bytes, bytes] = {}
            for event in response.events:
                if event.type == rpc.Event.PUT:
                    written[bytes(event.kv.key)] = bytes(event.kv.value)
                else:
                    written.pop(bytes(event.kv.key), None)
            return Fired(int(response.header.revision), written)
        if response.canceled:
            raise StoreConnectionError(
                member.address, f"etcd cancelled the watch: {response.cancel_reason}"
            )
        if response.created:
            established()
            created += 1
            began_after = int(response.header.revision)
            if created == len(ranges) and began_after >= start_revision:
                # Changes in [start_revision, began_after] came before the watch began.
                revision = await changed_in_gap(ranges, start_revision - 1)
                if revision is not None:
                    return Fired(revision)
