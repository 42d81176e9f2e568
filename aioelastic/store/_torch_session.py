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

Keys: torch 2.13's client puts ``/`` in front of every key it sends (and strips it from what
``list_keys`` returns); the session removes that one leading ``/``, so torch's ``set("k")`` is
our ``get("k")``, and puts it back in ``LIST_KEYS`` replies.

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
from typing import cast

import anyio
import anyio.abc

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
    TorchDecoder,
    TorchOp,
    TorchRequest,
    encode_i64,
    encode_keys,
    encode_queue_pop,
    encode_u32,
    encode_value,
    encode_values,
)

log = logging.getLogger("aioelastic.store.torch")


def store_key(wire_key: str) -> str:
    """The store key for a key as torch's client sends it (its leading ``/`` removed)."""
    return wire_key[1:] if wire_key.startswith("/") else wire_key


class _Later:
    """Marks a request that cannot be answered without waiting: :meth:`TorchSession.serve` will."""


LATER = _Later()


def _at_once(
    answer: Callable[[TorchRequest], bytes | _Later | None],
) -> Callable[[TorchRequest], Awaitable[bytes | None]]:
    """The handler for :meth:`TorchSession.serve` of a request always answered at once."""

    async def handle(request: TorchRequest) -> bytes | None:
        reply = answer(request)
        assert not isinstance(reply, _Later)
        return reply

    return handle


def _store_keys(request: TorchRequest) -> list[str]:
    """The store keys of a request whose one field is a list of keys."""
    return [store_key(key) for key in cast(list[str], request.fields[0])]


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

    def nonempty(self, name: str) -> bool:
        return bool(self._items.get(name))

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
        self.decoder = TorchDecoder(
            max_key_size=service.max_key_size,
            max_value_size=service.max_value_size,
            max_keys=service.max_keys,
        )
        self.validated = False
        self.closed = False
        self._drop_reason: str | None = None
        self.reported = False
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[TorchRequest | None](
            math.inf
        )
        self._scope = anyio.CancelScope()
        self._waits_queued = 0  # WAITs received and not yet started
        self._cancels = 0  # CANCEL_WAITs that arrived before the WAIT they cancel started
        self._active_wait: anyio.CancelScope | None = None
        self._queued = 0  # requests handed to serve() and not yet answered
        self._memory = self.store if isinstance(self.store, MemoryStore) else None
        self._now: dict[TorchOp, Callable[[TorchRequest], bytes | _Later | None]] = {
            TorchOp.CANCEL_WAIT: self._cancel_wait_now,
            TorchOp.PING: self._ping_now,
            TorchOp.QUEUE_PUSH: self._queue_push_now,
            TorchOp.QUEUE_POP: self._queue_pop_now,
            TorchOp.QUEUE_LEN: self._queue_len_now,
        }
        if self._memory is not None:  # the server's own store: most answers need no await
            self._now.update(
                {
                    TorchOp.SET: self._set_now,
                    TorchOp.COMPARE_SET: self._compare_set_now,
                    TorchOp.GET: self._get_now,
                    TorchOp.ADD: self._add_now,
                    TorchOp.CHECK: self._check_now,
                    TorchOp.WAIT: self._wait_now,
                    TorchOp.GETNUMKEYS: self._num_keys_now,
                    TorchOp.DELETE_KEY: self._delete_key_now,
                    TorchOp.APPEND: self._append_now,
                    TorchOp.MULTI_GET: self._multi_get_now,
                    TorchOp.MULTI_SET: self._multi_set_now,
                }
            )
        self._handlers: dict[TorchOp, Callable[[TorchRequest], Awaitable[bytes | None]]] = {
            TorchOp.SET: self._set,
            TorchOp.COMPARE_SET: self._compare_set,
            TorchOp.GET: self._get,
            TorchOp.ADD: self._add,
            TorchOp.CHECK: self._check,
            TorchOp.WAIT: self._wait,
            TorchOp.GETNUMKEYS: self._num_keys,
            TorchOp.DELETE_KEY: self._delete_key,
            TorchOp.APPEND: self._append,
            TorchOp.MULTI_GET: self._multi_get,
            TorchOp.MULTI_SET: self._multi_set,
            TorchOp.CANCEL_WAIT: _at_once(self._cancel_wait_now),
            TorchOp.PING: _at_once(self._ping_now),
            TorchOp.QUEUE_PUSH: _at_once(self._queue_push_now),
            TorchOp.QUEUE_POP: _at_once(self._queue_pop_now),
            TorchOp.QUEUE_LEN: _at_once(self._queue_len_now),
            TorchOp.LIST_KEYS: self._list_keys,
            TorchOp.VALIDATE: self._validate_again,
        }

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
        replies: list[bytes] = []
        for request in decoder.feed(data):
            if not self.validated:
                if request.op is not TorchOp.VALIDATE or request.fields[0] != VALIDATION_MAGIC:
                    self._queue_drop(
                        f"the first request must be VALIDATE with torch's magic number, not "
                        f"{request.op.name} {request.fields!r}"
                    )
                    break
                self.validated = True
                continue
            if not self._queued and (answer := self._now.get(request.op)) is not None:
                try:
                    reply = answer(request)
                except (StoreError, ValueError, TypeError, OverflowError) as error:
                    self._drop(f"{request.op.name} failed: {error}")
                    return b""
                if not isinstance(reply, _Later):
                    self.service._requests += 1
                    if reply is not None:
                        replies.append(reply)
                    continue
            if request.op is TorchOp.WAIT:
                self._waits_queued += 1
            elif request.op is TorchOp.CANCEL_WAIT:
                self._cancel_current_wait()
            self._queued += 1
            self._inbox_send.send_nowait(request)
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
                        reply = await self._handlers[request.op](request)
                    except (StoreError, ValueError, TypeError, OverflowError) as error:
                        self._drop(f"{request.op.name} failed: {error}")
                        return
                    if reply is not None:
                        await self.send(reply)
                    self._queued -= 1

    def _drop(self, reason: str) -> None:
        self.service._dropped += 1
        self.report(f"{reason}; closing the connection")
        self.hangup()
        self.close()

    # -- answers without waiting (queues, ping; every op on the server's own MemoryStore) -----

    def _present_now(self, keys: Sequence[str]) -> bool:
        assert self._memory is not None
        missing = [key for key in keys if not self.queues.nonempty(key)]
        return not missing or self._memory.check_nowait(missing)

    def _set_now(self, request: TorchRequest) -> None:
        assert self._memory is not None
        key, value = request.fields
        self._memory.set_nowait(store_key(key), value)  # type: ignore[arg-type]

    def _compare_set_now(self, request: TorchRequest) -> bytes:
        assert self._memory is not None
        key, expected, desired = request.fields
        return encode_value(self._memory.compare_set_nowait(store_key(key), expected, desired))  # type: ignore[arg-type]

    def _get_now(self, request: TorchRequest) -> bytes:
        assert self._memory is not None
        (key,) = request.fields
        values = self._memory.get_nowait((store_key(key),))  # type: ignore[arg-type]
        return encode_value(b"" if values is None else values[0])

    def _multi_get_now(self, request: TorchRequest) -> bytes:
        memory = self._memory
        assert memory is not None
        keys = _store_keys(request)
        values = memory.get_nowait(keys)
        if values is None:
            values = [(memory.get_nowait((key,)) or [b""])[0] for key in keys]
        return encode_values(values)

    def _add_now(self, request: TorchRequest) -> bytes:
        assert self._memory is not None
        key, amount = request.fields
        return encode_i64(self._memory.add_nowait(store_key(key), amount))  # type: ignore[arg-type]

    def _check_now(self, request: TorchRequest) -> bytes:
        return CHECK_READY if self._present_now(_store_keys(request)) else CHECK_NOT_READY

    def _wait_now(self, request: TorchRequest) -> bytes | _Later:
        return STOP_WAITING if self._present_now(_store_keys(request)) else LATER

    def _num_keys_now(self, request: TorchRequest) -> bytes:
        assert self._memory is not None
        return encode_i64(self._memory.num_keys_nowait())

    def _delete_key_now(self, request: TorchRequest) -> bytes:
        assert self._memory is not None
        (key,) = request.fields
        return encode_i64(1 if self._memory.delete_nowait(store_key(key)) else 0)  # type: ignore[arg-type]

    def _append_now(self, request: TorchRequest) -> None:
        assert self._memory is not None
        key, value = request.fields
        self._memory.append_nowait(store_key(key), value)  # type: ignore[arg-type]

    def _multi_set_now(self, request: TorchRequest) -> None:
        assert self._memory is not None
        pairs = cast(list[tuple[str, bytes]], request.fields[0])
        self._memory.multi_set_nowait([store_key(key) for key, _ in pairs], [v for _, v in pairs])

    def _cancel_wait_now(self, request: TorchRequest) -> bytes:
        return WAIT_CANCELED

    def _ping_now(self, request: TorchRequest) -> bytes:
        (nonce,) = request.fields
        return encode_u32(nonce)  # type: ignore[arg-type]

    def _queue_push_now(self, request: TorchRequest) -> None:
        key, value = request.fields
        self.queues.push(store_key(key), value)  # type: ignore[arg-type]

    def _queue_pop_now(self, request: TorchRequest) -> bytes:
        (key,) = request.fields
        return encode_queue_pop(*self.queues.pop(store_key(key)))  # type: ignore[arg-type]

    def _queue_len_now(self, request: TorchRequest) -> bytes:
        (key,) = request.fields
        return encode_i64(self.queues.length(store_key(key)))  # type: ignore[arg-type]

    # -- requests ---------------------------------------------------------------------------

    async def _set(self, request: TorchRequest) -> None:
        key, value = request.fields
        await self.store.set(store_key(key), value)  # type: ignore[arg-type]

    async def _compare_set(self, request: TorchRequest) -> bytes:
        key, expected, desired = request.fields
        stored = await self.store.compare_set(store_key(key), expected, desired)  # type: ignore[arg-type]
        return encode_value(stored)

    async def _value_or_empty(self, key: str) -> bytes:
        """The value of ``key``, or empty bytes if it is missing (torch's GET)."""
        try:
            return await self.store.get(key, timeout=0)
        except StoreTimeoutError:
            return b""

    async def _get(self, request: TorchRequest) -> bytes:
        (key,) = request.fields
        return encode_value(await self._value_or_empty(store_key(key)))  # type: ignore[arg-type]

    async def _multi_get(self, request: TorchRequest) -> bytes:
        keys = _store_keys(request)
        try:
            values = await self.store.multi_get(keys, timeout=0)
        except StoreTimeoutError:
            values = [await self._value_or_empty(key) for key in keys]
        return encode_values(values)

    async def _add(self, request: TorchRequest) -> bytes:
        key, amount = request.fields
        return encode_i64(await self.store.add(store_key(key), amount))  # type: ignore[arg-type]

    async def _present(self, keys: Sequence[str]) -> bool:
        """Whether every key exists, as a key or as a non-empty queue (torch's CHECK)."""
        queues = self.queues
        missing = [key for key in keys if not queues.nonempty(key)]
        return not missing or await self.store.check(missing)

    async def _check(self, request: TorchRequest) -> bytes:
        keys = _store_keys(request)
        return CHECK_READY if await self._present(keys) else CHECK_NOT_READY

    async def _wait(self, request: TorchRequest) -> bytes | None:
        self._waits_queued -= 1
        if self._cancels:
            self._cancels -= 1  # cancelled before it started: the CANCEL_WAIT answers
            return None
        keys = _store_keys(request)
        if await self._present(keys):
            return STOP_WAITING
        with anyio.CancelScope() as scope:
            self._active_wait = scope
            self.service._waiting += 1
            try:
                await self._wait_present(keys)
            finally:
                self._active_wait = None
                self.service._waiting -= 1
        return None if scope.cancelled_caught else STOP_WAITING

    async def _wait_present(self, keys: list[str]) -> None:
        """Return once every key exists as a key or a non-empty queue; no polling."""
        queues = self.queues
        while True:
            missing = [key for key in keys if not queues.nonempty(key)]
            pushed = queues.watch(missing)  # before the check, so no push slips between
            try:
                if not missing or await self.store.check(missing):
                    return
                async with anyio.create_task_group() as race:
                    race.start_soon(self._wait_set, missing, race.cancel_scope)
                    await pushed.wait()
                    race.cancel_scope.cancel()
            finally:
                queues.unwatch(missing, pushed)

    async def _wait_set(self, keys: list[str], scope: anyio.CancelScope) -> None:
        """Wait until every key is set in the store, then cancel ``scope`` (the race)."""
        await self.store.wait(keys, timeout=math.inf)
        scope.cancel()

    async def _num_keys(self, request: TorchRequest) -> bytes:
        return encode_i64(await self.store.num_keys())

    async def _delete_key(self, request: TorchRequest) -> bytes:
        (key,) = request.fields
        existed = await self.store.delete_key(store_key(key))  # type: ignore[arg-type]
        return encode_i64(1 if existed else 0)

    async def _append(self, request: TorchRequest) -> None:
        key, value = request.fields
        await self.store.append(store_key(key), value)  # type: ignore[arg-type]

    async def _multi_set(self, request: TorchRequest) -> None:
        pairs = cast(list[tuple[str, bytes]], request.fields[0])
        keys = [store_key(key) for key, _ in pairs]
        await self.store.multi_set(keys, [value for _, value in pairs])

    async def _list_keys(self, request: TorchRequest) -> bytes:
        snapshot = await self.store.get_prefix("")
        return encode_keys([f"/{key}" for key in snapshot.items])

    async def _validate_again(self, request: TorchRequest) -> None:
        raise ValueError("VALIDATE was already sent on this connection")
