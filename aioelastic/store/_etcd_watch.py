"""Waiting on etcd for :class:`~aioelastic.store.EtcdStore`: watches that survive their member.

A wait is a watch from a revision; concurrent equal waits share one watch (:class:`SharedCalls`,
run in the store's task group). Every watch of a store on one member goes over one
bidirectional Watch stream (:class:`WatchStream`): etcd gives each create request on a stream a
watch id, and tags each response with it, so a watch costs a create and a cancel message, not a
stream of its own (opening and closing a gRPC stream costs more CPU than a unary call). The
stream's creates are written in order and etcd confirms them in order, which is how a created
response finds its watch. A watch's stream dies with the member holding it, and a stalled member
(paused, or cut off) keeps its stream open and silent, so each stream runs beside a probe: a
small read every request timeout, which fails once the member stops answering. On either
failure every watch of the stream is re-opened from its own start revision on the next member,
with backoff, until the members have failed for the retry budget. A compacted start revision
ends the wait early (the caller re-reads). A watch replays history only after a short delay, so
a wait that timed out checks the history with one read before it gives up
(:meth:`Watches.changed_since`).
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
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


class WatchStream:
    """One bidirectional Watch stream to ``member``, shared by every watch the store makes there.

    :meth:`open` returns a :class:`StreamWatch`, which reads and writes as a stream of its own
    would: its create requests go out under the stream's lock, in order, and the created
    response that comes back next binds the next watch id to it; responses then reach it by
    their watch id. Closing a watch cancels its ids (a cancel request), freeing them. When the
    stream fails (an error, its end, or the probe: the member stopped answering) every watch on
    it fails with that error, and the next watch opens a new stream.
    """

    def __init__(self, member: Member, call: Any, task_group: TaskGroup) -> None:
        self.member = member
        self._call = call
        self._tg = task_group
        self._lock = anyio.Lock()  # grpc allows one write in flight on a stream
        self._creating: deque[StreamWatch] = deque()  # creates sent, awaiting their ids
        self._watches: dict[int, StreamWatch] = {}  # watch id -> its watch
        self.error: BaseException | None = None

    def __len__(self) -> int:
        """Watch ids in use: created ones, and creates not yet confirmed."""
        return len(self._watches) + len(self._creating)

    @property
    def created(self) -> int:
        """Watch ids etcd confirmed and not yet cancelled."""
        return len(self._watches)

    def open(self) -> StreamWatch:
        """A new watch on this stream (created by the requests written to it)."""
        return StreamWatch(self)

    async def run(self, probe: Callable[[Member], Awaitable[None]]) -> None:
        """Read the stream and hand each response to its watch, beside ``probe(member)``
        (which raises once the member stops answering), until either fails."""
        try:
            await first_of(self._read, functools.partial(probe, self.member))
        except Exception as error:
            self.fail(error)
        finally:  # cancelled (the store closes): any watch left learns the stream is gone
            self.fail(StoreConnectionError(self.member.address, "the watch stream closed"))

    async def _read(self) -> None:
        while True:
            response = await settle(self._call.read())
            if response is grpc.aio.EOF:
                raise StoreConnectionError(self.member.address, "the watch stream ended")
            if response.created:
                watch = self._creating.popleft()
                if not response.canceled:
                    watch.ids.append(response.watch_id)
                    self._watches[response.watch_id] = watch
                    if watch.closed:
                        self._cancel_soon(response.watch_id)
                watch.deliver(response)
                continue
            if response.canceled:
                found = self._watches.pop(response.watch_id, None)
            else:
                found = self._watches.get(response.watch_id)
            if found is not None:
                found.deliver(response)

    def fail(self, error: BaseException) -> None:
        """End the stream: every watch on it fails with ``error`` (the first one given)."""
        if self.error is None:
            self.error = error
        watches = {id(watch): watch for watch in (*self._creating, *self._watches.values())}
        self._creating.clear()
        self._watches.clear()
        for watch in watches.values():
            watch.fail(self.error)
        self._call.cancel()

    async def create(self, watch: StreamWatch, request: Any) -> None:
        """Write ``request`` (a create) for ``watch``; its id comes with the next created."""
        async with self._lock:
            if self.error is None and self._call.done():
                self.fail(StoreConnectionError(self.member.address, "the watch stream ended"))
            if self.error is not None:
                raise self.error
            self._creating.append(watch)
            try:
                await settle(self._call.write(request))
            except Exception as error:
                failure = _stream_error(self.member, error)
                self.fail(failure)
                raise failure from None

    def _cancel_soon(self, watch_id: int) -> None:
        """Cancel ``watch_id`` (from a closing watch, which may itself be cancelled)."""
        self._watches.pop(watch_id, None)
        if self.error is None:
            with contextlib.suppress(RuntimeError):  # the store's task group has closed
                self._tg.start_soon(self._cancel, watch_id)

    async def _cancel(self, watch_id: int) -> None:
        cancel = rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=watch_id))
        async with self._lock:
            if self.error is not None or self._call.done():
                return  # a stream that ended holds no watches on etcd
            try:
                await settle(self._call.write(cancel))
            except Exception as error:
                self.fail(_stream_error(self.member, error))


def _stream_error(member: Member, error: BaseException) -> BaseException:
    """What a failed write on a stream means to its watches: a gRPC error as it is (the watch
    decides whether to fail over), anything else (grpc's "RPC already finished") the end of
    the stream."""
    if is_rpc_error(error) or isinstance(error, StoreConnectionError):
        return error
    return StoreConnectionError(member.address, f"the watch stream ended ({describe(error)})")


class StreamWatch:
    """One watch on a :class:`WatchStream` (one or more watch ids): ``write`` its create
    requests, ``read`` its responses; :meth:`close` cancels its ids."""

    def __init__(self, stream: WatchStream) -> None:
        self._stream = stream
        self.ids: list[int] = []
        self.closed = False
        self._responses: deque[Any] = deque()
        self._arrived = anyio.Event()
        self._error: BaseException | None = None

    async def write(self, request: Any) -> None:
        await self._stream.create(self, request)

    async def read(self) -> Any:
        while not self._responses:
            if self._error is not None:
                raise self._error
            await self._arrived.wait()
            self._arrived = anyio.Event()
        return self._responses.popleft()

    def deliver(self, response: Any) -> None:
        self._responses.append(response)
        self._arrived.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._arrived.set()

    def close(self) -> None:
        """Cancel this watch's ids (any created later are cancelled as they come)."""
        self.closed = True
        ids, self.ids = self.ids, []
        for watch_id in ids:
            self._stream._cancel_soon(watch_id)


class Watches:
    """Shared, failing-over watches on ``conn``, over one :class:`WatchStream` a member.

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
        self._streams: dict[str, WatchStream] = {}  # member address -> its stream

    def streams(self) -> list[WatchStream]:
        """The open streams (one a member at most)."""
        return [stream for stream in self._streams.values() if stream.error is None]

    async def watch(self, task_group: TaskGroup, ranges: Ranges, start_revision: int) -> Fired:
        """Return once a key in ``ranges`` changes at ``start_revision`` or later (or that
        history was compacted: then with nothing written); concurrent equal waits share one
        watch, which runs in ``task_group``."""
        key = (tuple(ranges), start_revision)
        watch = functools.partial(self._watch_failing_over, task_group, ranges, start_revision)
        return await self._shared.call(task_group, key, watch)

    async def stream(self, task_group: TaskGroup, member: Member) -> WatchStream:
        """The open stream to ``member``, opened (its reader and probe in ``task_group``) if
        there is none."""
        stream = self._streams.get(member.address)
        if stream is None or stream.error is not None:
            await self._conn.authenticate(member)
            stream = self._streams.get(member.address)  # another watch may have opened one
            if stream is not None and stream.error is None:
                return stream
            # "hasleader": etcd ends the stream if this member loses its leader (no stale waits).
            self._conn.requests += 1
            call = member.watch.Watch(metadata=(*(member.metadata or ()), ("hasleader", "true")))
            stream = self._streams[member.address] = WatchStream(member, call, task_group)
            task_group.start_soon(stream.run, self._probe)
        return stream

    async def _watch_failing_over(
        self, task_group: TaskGroup, ranges: Ranges, start_revision: int
    ) -> Fired:
        """:meth:`watch` for one caller, re-watching on another member on failure."""
        failing_since: float | None = None
        delay = 0.05

        def established() -> None:
            nonlocal failing_since, delay
            failing_since, delay = None, 0.05

        while True:
            member = self._conn.current
            try:
                revision = await self._watch_on(
                    task_group, member, ranges, start_revision, established
                )
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
        task_group: TaskGroup,
        member: Member,
        ranges: Ranges,
        start_revision: int,
        established: Callable[[], None],
    ) -> Fired | None:
        """Watch ``ranges`` on ``member``'s stream (which its probe fails once ``member``
        stops answering: grpc's keepalive may take a minute to notice a stalled member)."""
        stream = await self.stream(task_group, member)
        watch = stream.open()
        try:
            return await _read_watch(
                watch, member, ranges, start_revision, established, self._changed_in_gap
            )
        except StoreConnectionError as error:
            stream.fail(error)  # "etcd cancelled the watch" or the stream's end: start afresh
            raise
        finally:
            watch.close()

    async def _probe(self, member: Member) -> None:
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

    async def _changed_in_gap(self, ranges: Ranges, after: int) -> Fired | None:
        """How the watch would have ended had a key in ``ranges`` changed after ``after``,
        else None: what a watch created later than ``after`` cannot report. Single keys are
        read in one request, with their values (a wait for a key to appear needs no read
        after it); each prefix range costs a read of its own."""
        keys = [start for start, end in ranges if not end]
        if keys:
            fired = await self._keys_changed_since(keys, after)
            if fired is not None:
                return fired
        for start, end in ranges:
            if end:
                revision = await self.changed_since(start, end, after)
                if revision is not None:
                    return Fired(revision)
        return None

    async def _keys_changed_since(self, keys: Sequence[bytes], after: int) -> Fired | None:
        """:class:`Fired` with the values ``keys`` hold now if one changed after ``after``
        (written, or deleted: then it is absent), else None; one transaction: each key now and
        at ``after``."""
        request = rpc.TxnRequest()
        for key in keys:
            request.success.add().request_range.key = key
            then = request.success.add().request_range
            then.key, then.revision, then.keys_only = key, after, True
        response = await self._read_history(request)
        if isinstance(response, bool):
            return Fired(await self._revision()) if response else None
        results = [op.response_range for op in response.responses]
        written: dict[bytes, bytes] = {}
        changed = False
        for key, now, then in zip(keys, results[::2], results[1::2], strict=True):
            if now.kvs:
                written[key] = bytes(now.kvs[0].value)
                changed = changed or now.kvs[0].mod_revision > after
            else:
                changed = changed or bool(then.kvs)
        return Fired(int(response.header.revision), written) if changed else None

    async def _read_history(self, request: Any) -> Any:
        """Send ``request`` (a transaction of reads, some at a past revision): its response,
        or for a revision out of range whether the history was compacted (then callers report
        a change and re-read; "future revision": nothing can have changed after it yet)."""

        async def attempt(member: Member, timeout: float) -> Any:
            try:
                return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                return "compacted" in (error.details() or "")

        return await self._conn.call("read", attempt)

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
        response = await self._read_history(request)
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
    changed_in_gap: Callable[[Ranges, int], Awaitable[Fired | None]],
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
        await call.write(rpc.WatchRequest(create_request=create))
    created = 0
    while True:
        response = await call.read()
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
                fired = await changed_in_gap(ranges, start_revision - 1)
                if fired is not None:
                    return fired
