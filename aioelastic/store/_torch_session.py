"""Torch's ``TCPStore`` protocol served over any aioelastic :class:`Store`.

A :class:`TorchService` holds what the torch connections of one listener share: the backing
store (one keyspace with our own clients: a ``set`` from either side wakes a waiter of
either), torch's named queues and the counters. Each connection is a :class:`TorchSession`:
:meth:`TorchSession.receive` decodes bytes as they arrive and queues the requests;
:meth:`TorchSession.serve` (a task in the listener's task group) answers them one at a time,
in order, because torch's protocol has no request ids and its replies must come back in the
order of the requests. A ``WAIT`` on a missing key is held server-side (an ``await`` on the
store, never a poll) until the key is set, the client sends ``CANCEL_WAIT`` (its client-side
timeout ran out) or the connection goes away.

Requests are typed (:mod:`._torch_requests`: one class per op, keys already store keys), and
one table, :data:`HANDLERS`, says how each class is answered: at once without a store (queues,
ping), at once from the server's own :class:`MemoryStore` (most requests, on the TCP server),
and by awaiting any store (what :meth:`TorchSession.serve` does). While nothing is queued,
:meth:`TorchSession.receive` answers what it can at once, in order; the first request that
must wait, and every one after it until ``serve`` catches up, is queued.

Keys: torch 2.13's client puts ``/`` in front of every key it sends (and strips it from what
``list_keys`` returns); the typed requests carry the key without it, and ``LIST_KEYS``
replies put it back.

Queues (``queue_push``/``queue_pop``/``queue_len``) live in the service, apart from keys as in
torch's own server: the torch clients of one listener share them; clients of another listener
over the same store do not see them.

Bad input costs its connection only: a stream that cannot be decoded, a second ``VALIDATE``,
a request before the first one, an ``add`` on a non-integer (torch's server drops those too)
close that connection with a logged reason (the first one a warning) and a count in
:meth:`TorchService.statistics`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc

from aioelastic._concurrency import first_of
from aioelastic.store._api import Store
from aioelastic.store._errors import StoreError, StoreTimeoutError
from aioelastic.store._memory import MemoryStore
from aioelastic.store._torch_codec import (
    CHECK_NOT_READY,
    CHECK_READY,
    DEFAULT_MAX_KEY_SIZE,
    DEFAULT_MAX_KEYS,
    DEFAULT_MAX_VALUE_SIZE,
    STOP_WAITING,
    VALIDATION_MAGIC,
    WAIT_CANCELED,
    TorchOp,
    encode_i64,
    encode_keys,
    encode_queue_pop,
    encode_u32,
    encode_value,
    encode_values,
)
from aioelastic.store._torch_requests import (
    AnyTorchRequest,
    TorchAdd,
    TorchAppend,
    TorchCancelWait,
    TorchCheck,
    TorchCompareSet,
    TorchDeleteKey,
    TorchGet,
    TorchListKeys,
    TorchMultiGet,
    TorchMultiSet,
    TorchNumKeys,
    TorchPing,
    TorchQueueLen,
    TorchQueuePop,
    TorchQueuePush,
    TorchSet,
    TorchValidate,
    TorchWait,
    typed_decoder,
)

log = logging.getLogger("aioelastic.store.torch")


class _Later:
    """Marks a request that cannot be answered without waiting: :meth:`TorchSession.serve` will."""


LATER = _Later()


class TorchQueues:
    """Torch's named FIFO queues, with waiters woken by a push."""

    def __init__(self) -> None:
        self._items: dict[str, deque[bytes]] = {}
        self._watchers: dict[str, set[anyio.Event]] = {}

    def push(self, name: str, value: bytes) -> None:
        self._items.setdefault(name, deque()).append(value)
        for event in self._watchers.pop(name, ()):
            event.set()

    def pop(self, name: str) -> tuple[int, bytes | None]:
        """Return the queue's length before the pop and its first item (None if empty)."""
        items = self._items.get(name)
        if not items:
            return 0, None
        length = len(items)
        value = items.popleft()
        if not items:
            del self._items[name]
        return length, value

    def length(self, name: str) -> int:
        return len(self._items.get(name, ()))

    def missing(self, names: list[str]) -> list[str]:
        """The names of ``names`` that are not a non-empty queue (all of them, at once, when
        there are no queues: the usual case)."""
        items = self._items
        return [name for name in names if not items.get(name)] if items else names

    def watch(self, names: Sequence[str]) -> anyio.Event:
        """Return an event set by the next push to any of ``names``."""
        event = anyio.Event()
        for name in names:
            self._watchers.setdefault(name, set()).add(event)
        return event

    def unwatch(self, names: Sequence[str], event: anyio.Event) -> None:
        for name in names:
            watchers = self._watchers.get(name)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[name]


@dataclass(frozen=True, slots=True)
class TorchServiceStatistics:
    """A snapshot of a :class:`TorchService`'s counters."""

    connections: int
    """Torch connections open now."""
    connections_total: int
    requests: int
    waiting_requests: int
    """``WAIT`` requests held server-side now."""
    dropped_connections: int
    """Torch connections closed because of what they sent."""


class TorchService:
    """Serves torch ``TCPStore`` clients over ``store``; one per listener.

    The limits bound what one request may declare (torch's client has no frame limit of its
    own); a request above them closes its connection.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_key_size: int = DEFAULT_MAX_KEY_SIZE,
        max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        self.store = store
        self.queues = TorchQueues()
        self.max_key_size = max_key_size
        self.max_value_size = max_value_size
        self.max_keys = max_keys
        self._connections = 0
        self._connections_total = 0
        self._requests = 0
        self._waiting = 0
        self._dropped = 0

    def use_store(self, store: Store) -> None:
        """Serve ``store``, with empty queues, to the sessions created from now on."""
        self.store = store
        self.queues = TorchQueues()

    def statistics(self) -> TorchServiceStatistics:
        """Return a snapshot of the connection and request counters."""
        return TorchServiceStatistics(
            connections=self._connections,
            connections_total=self._connections_total,
            requests=self._requests,
            waiting_requests=self._waiting,
            dropped_connections=self._dropped,
        )

    def session(
        self,
        peer: str,
        *,
        send: Callable[[bytes], Awaitable[None]],
        hangup: Callable[[], object],
    ) -> TorchSession:
        """A session for one new connection: ``send`` writes replies, ``hangup`` closes it."""
        return TorchSession(self, peer, send=send, hangup=hangup)


class TorchSession:
    """One torch client connection: requests in (:meth:`receive`), replies out (:meth:`serve`)."""

    def __init__(
        self,
        service: TorchService,
        peer: str,
        *,
        send: Callable[[bytes], Awaitable[None]],
        hangup: Callable[[], object],
    ) -> None:
        service._connections += 1
        service._connections_total += 1
        self.service = service
        self.store = service.store
        self.queues = service.queues
        self.peer = peer
        self.send = send
        self.hangup = hangup
        self.decoder = typed_decoder(
            max_key_size=service.max_key_size,
            max_value_size=service.max_value_size,
            max_keys=service.max_keys,
        )
        self.validated = False
        self.closed = False
        self._drop_reason: str | None = None
        self.reported = False
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[AnyTorchRequest | None](
            math.inf
        )
        self._scope = anyio.CancelScope()
        self._waits_queued = 0  # WAITs received and not yet started
        self._cancels = 0  # CANCEL_WAITs that arrived before the WAIT they cancel started
        self._active_wait: anyio.CancelScope | None = None
        self._queued = 0  # requests handed to serve() and not yet answered
        memory = self.store if isinstance(self.store, MemoryStore) else None
        self._now, self._later = _bind(self, memory)

    def report(self, reason: str) -> None:
        """Log a problem with this client: the first as a warning, the rest at debug level."""
        level = logging.DEBUG if self.reported else logging.WARNING
        self.reported = True
        log.log(level, "torch store client %s: %s", self.peer, reason)

    def receive(self, data: bytes) -> bytes:
        """Take received bytes; return the replies to send now (maybe empty).

        While nothing is queued, what can be answered without waiting is answered here (in
        order, from the read); the first request that must wait, and every one after it until
        :meth:`serve` catches up, is queued for :meth:`serve`.
        """
        if self.closed or self._drop_reason is not None:
            return b""
        decoder = self.decoder
        requests = decoder.feed(data)
        if not self.validated and requests:
            first = requests[0]
            if not isinstance(first, TorchValidate) or first.magic != VALIDATION_MAGIC:
                self._queue_drop(
                    "the first request must be VALIDATE with torch's magic number, not "
                    f"{_op_name(first)} {first!r}"
                )
                return b""
            self.validated = True
            del requests[0]
        replies: list[bytes] = []
        now = self._now
        answered = 0
        for request in requests:
            if not self._queued and (answer := now.get(type(request))) is not None:
                try:
                    reply = answer(request)
                except (StoreError, ValueError, TypeError, OverflowError) as error:
                    self.service._requests += answered
                    self._drop(f"{_op_name(request)} failed: {error}")
                    return b""
                if reply is not LATER:
                    answered += 1
                    if reply is not None:
                        replies.append(reply)  # type: ignore[arg-type]
                    continue
            if isinstance(request, TorchWait):
                self._waits_queued += 1
            elif isinstance(request, TorchCancelWait):
                self._cancel_current_wait()
            self._queued += 1
            self._inbox_send.send_nowait(request)
        self.service._requests += answered
        if decoder.error is not None:
            self._queue_drop(decoder.error.reason)
        return replies[0] if len(replies) == 1 else b"".join(replies)

    def _cancel_current_wait(self) -> None:
        """A ``CANCEL_WAIT`` arrived: withdraw the wait it is about (running or still queued)."""
        if self._active_wait is not None:
            self._active_wait.cancel()
        elif self._waits_queued > 0:
            self._cancels += 1

    def _queue_drop(self, reason: str) -> None:
        """Serve what came before, then close the connection for ``reason``."""
        self._drop_reason = reason
        self._inbox_send.send_nowait(None)

    def close(self) -> None:
        """The connection is gone: stop serving it and withdraw its waits (once)."""
        if self.closed:
            return
        self.closed = True
        self.service._connections -= 1
        self._scope.cancel()
        self._inbox_send.close()

    async def serve(self) -> None:
        """Answer the queued requests in order until the connection closes."""
        with self._scope:
            async with self._inbox:
                async for request in self._inbox:
                    if request is None:
                        self._drop(self._drop_reason or "dropped")
                        return
                    self.service._requests += 1
                    try:
                        reply = await self._later[type(request)](request)
                    except (StoreError, ValueError, TypeError, OverflowError) as error:
                        self._drop(f"{_op_name(request)} failed: {error}")
                        return
                    if reply is not None:
                        await self.send(reply)
                    self._queued -= 1

    def _drop(self, reason: str) -> None:
        self.service._dropped += 1
        self.report(f"{reason}; closing the connection")
        self.hangup()
        self.close()

    # -- what needs the session: presence (keys or queues) and the wait -------------------

    async def present(self, keys: list[str]) -> bool:
        """Whether every key exists, as a key or as a non-empty queue (torch's CHECK)."""
        missing = self.queues.missing(keys)
        return not missing or await self.store.check(missing)

    async def wait(self, request: TorchWait) -> bytes | None:
        """Torch's ``WAIT``: held until every key exists, unless a ``CANCEL_WAIT`` withdraws it
        (running or still queued: then the ``CANCEL_WAIT``'s reply is the only one)."""
        self._waits_queued -= 1
        if self._cancels:
            self._cancels -= 1  # cancelled before it started: the CANCEL_WAIT answers
            return None
        if await self.present(request.keys):
            return STOP_WAITING
        with anyio.CancelScope() as scope:
            self._active_wait = scope
            self.service._waiting += 1
            try:
                await self._wait_present(request.keys)
            finally:
                self._active_wait = None
                self.service._waiting -= 1
        return None if scope.cancelled_caught else STOP_WAITING

    async def _wait_present(self, keys: list[str]) -> None:
        """Return once every key exists as a key or a non-empty queue; no polling."""
        queues, store = self.queues, self.store
        while True:
            missing = queues.missing(keys)
            pushed = queues.watch(missing)  # before the check, so no push slips between
            try:
                if not missing or await store.check(missing):
                    return
                set_in_store = partial(store.wait, missing, timeout=math.inf)
                await first_of(set_in_store, pushed.wait)  # then look again
            finally:
                queues.unwatch(missing, pushed)


def _op_name(request: AnyTorchRequest) -> str:
    return _OPS[type(request)].name


R = TypeVar("R")
Now = Callable[[Any], "bytes | _Later | None"]
Later = Callable[[Any], Awaitable["bytes | None"]]


@dataclass(frozen=True)
class Handler(Generic[R]):
    """How one class of torch request is answered (at most one of ``free`` and ``memory``).

    ``free``: at once, needing no store (the queues, a ping); ``memory``: at once from the
    server's own :class:`MemoryStore`, or :data:`LATER` when it must wait; ``later``: by
    awaiting the session's store, whatever it is (a ``free`` handler needs none).
    """

    op: TorchOp
    later: Callable[[TorchSession, R], Awaitable[bytes | None]] | None = None
    memory: Callable[[MemoryStore, TorchQueues, R], bytes | _Later | None] | None = None
    free: Callable[[TorchQueues, R], bytes | None] | None = None


def _bind(
    session: TorchSession, memory: MemoryStore | None
) -> tuple[dict[type, Now], dict[type, Later]]:
    """The session's two lookups from :data:`HANDLERS`: what it answers in
    :meth:`TorchSession.receive` (the ``free`` handlers, and the ``memory`` ones when its
    store is a :class:`MemoryStore`), and how :meth:`TorchSession.serve` answers each class."""
    now: dict[type, Now] = {}
    later: dict[type, Later] = {}
    for cls, handler in HANDLERS.items():
        if handler.free is not None:
            now[cls] = answer = partial(handler.free, session.queues)
            later[cls] = partial(_at_once, answer)
            continue
        if handler.memory is not None and memory is not None:
            now[cls] = partial(handler.memory, memory, session.queues)
        assert handler.later is not None
        later[cls] = partial(handler.later, session)
    return now, later


async def _at_once(answer: Callable[[Any], bytes | None], request: object) -> bytes | None:
    return answer(request)


# -- at once, on the server's own MemoryStore --------------------------------------------------


def _present_now(memory: MemoryStore, queues: TorchQueues, keys: list[str]) -> bool:
    missing = queues.missing(keys)
    return not missing or memory.check_nowait(missing)


def _get_now(memory: MemoryStore, _: TorchQueues, request: TorchGet) -> bytes:
    values = memory.get_nowait((request.key,))
    return encode_value(b"" if values is None else values[0])


def _multi_get_now(memory: MemoryStore, _: TorchQueues, request: TorchMultiGet) -> bytes:
    keys = request.keys
    values = memory.get_nowait(keys)
    if values is None:
        values = [(memory.get_nowait((key,)) or [b""])[0] for key in keys]
    return encode_values(values)


# -- by awaiting any store --------------------------------------------------------------------


async def _value_or_empty(store: Store, key: str) -> bytes:
    """The value of ``key``, or empty bytes if it is missing (torch's GET)."""
    try:
        return await store.get(key, timeout=0)
    except StoreTimeoutError:
        return b""


async def _set(s: TorchSession, request: TorchSet) -> None:
    await s.store.set(request.key, request.value)


async def _compare_set(s: TorchSession, request: TorchCompareSet) -> bytes:
    return encode_value(await s.store.compare_set(request.key, request.expected, request.desired))


async def _get(s: TorchSession, request: TorchGet) -> bytes:
    return encode_value(await _value_or_empty(s.store, request.key))


async def _multi_get(s: TorchSession, request: TorchMultiGet) -> bytes:
    try:
        values = await s.store.multi_get(request.keys, timeout=0)
    except StoreTimeoutError:
        values = [await _value_or_empty(s.store, key) for key in request.keys]
    return encode_values(values)


async def _add(s: TorchSession, request: TorchAdd) -> bytes:
    return encode_i64(await s.store.add(request.key, request.amount))


async def _check(s: TorchSession, request: TorchCheck) -> bytes:
    return CHECK_READY if await s.present(request.keys) else CHECK_NOT_READY


async def _num_keys(s: TorchSession, request: TorchNumKeys) -> bytes:
    return encode_i64(await s.store.num_keys())


async def _delete_key(s: TorchSession, request: TorchDeleteKey) -> bytes:
    return encode_i64(1 if await s.store.delete_key(request.key) else 0)


async def _append(s: TorchSession, request: TorchAppend) -> None:
    await s.store.append(request.key, request.value)


async def _multi_set(s: TorchSession, request: TorchMultiSet) -> None:
    await s.store.multi_set(request.keys, request.values)


async def _list_keys(s: TorchSession, request: TorchListKeys) -> bytes:
    snapshot = await s.store.get_prefix("")
    return encode_keys([f"/{key}" for key in snapshot.items])


async def _validate_again(s: TorchSession, request: TorchValidate) -> None:
    raise ValueError("VALIDATE was already sent on this connection")


HANDLERS: dict[type, Handler[Any]] = {
    TorchSet: Handler[TorchSet](TorchOp.SET, _set, lambda m, q, r: m.set_nowait(r.key, r.value)),
    TorchCompareSet: Handler[TorchCompareSet](
        TorchOp.COMPARE_SET,
        _compare_set,
        lambda m, q, r: encode_value(m.compare_set_nowait(r.key, r.expected, r.desired)),
    ),
    TorchGet: Handler[TorchGet](TorchOp.GET, _get, _get_now),
    TorchAdd: Handler[TorchAdd](
        TorchOp.ADD, _add, lambda m, q, r: encode_i64(m.add_nowait(r.key, r.amount))
    ),
    TorchCheck: Handler[TorchCheck](
        TorchOp.CHECK,
        _check,
        lambda m, q, r: CHECK_READY if _present_now(m, q, r.keys) else CHECK_NOT_READY,
    ),
    TorchWait: Handler[TorchWait](
        TorchOp.WAIT,
        TorchSession.wait,
        lambda m, q, r: STOP_WAITING if _present_now(m, q, r.keys) else LATER,
    ),
    TorchNumKeys: Handler[TorchNumKeys](
        TorchOp.GETNUMKEYS, _num_keys, lambda m, q, r: encode_i64(m.num_keys_nowait())
    ),
    TorchDeleteKey: Handler[TorchDeleteKey](
        TorchOp.DELETE_KEY,
        _delete_key,
        lambda m, q, r: encode_i64(1 if m.delete_nowait(r.key) else 0),
    ),
    TorchAppend: Handler[TorchAppend](
        TorchOp.APPEND, _append, lambda m, q, r: m.append_nowait(r.key, r.value)
    ),
    TorchMultiGet: Handler[TorchMultiGet](TorchOp.MULTI_GET, _multi_get, _multi_get_now),
    TorchMultiSet: Handler[TorchMultiSet](
        TorchOp.MULTI_SET, _multi_set, lambda m, q, r: m.multi_set_nowait(r.keys, r.values)
    ),
    TorchCancelWait: Handler[TorchCancelWait](TorchOp.CANCEL_WAIT, free=lambda q, r: WAIT_CANCELED),
    TorchPing: Handler[TorchPing](TorchOp.PING, free=lambda q, r: encode_u32(r.nonce)),
    TorchQueuePush: Handler[TorchQueuePush](
        TorchOp.QUEUE_PUSH, free=lambda q, r: q.push(r.key, r.value)
    ),
    TorchQueuePop: Handler[TorchQueuePop](
        TorchOp.QUEUE_POP, free=lambda q, r: encode_queue_pop(*q.pop(r.key))
    ),
    TorchQueueLen: Handler[TorchQueueLen](
        TorchOp.QUEUE_LEN, free=lambda q, r: encode_i64(q.length(r.key))
    ),
    TorchListKeys: Handler[TorchListKeys](TorchOp.LIST_KEYS, _list_keys),
    TorchValidate: Handler[TorchValidate](TorchOp.VALIDATE, _validate_again),
}
"""How each request class is answered (see the module docstring)."""

_OPS = {cls: handler.op for cls, handler in HANDLERS.items()}
