"""The in-process store: a dict, revisions, TTLs on an injectable clock, event-driven waits.

Theory of operation. Every mutation (write, delete, expiry) takes the next revision and records
it per key in ``_changed`` (deleted keys keep a tombstone there, so a delete is a change too).
Waiters register a signal (a future on asyncio), either on one missing key (``get``/``wait``)
or on a prefix (``wait_for_change``); a mutation fires the signals of the waiters it concerns.
Keys are also kept in a directory tree (:mod:`._keyindex`), so a prefix read, a "changed since"
check and finding the waiters a change concerns cost what the prefix holds or the key's depth,
never a scan of the whole store: a thousand nodes each watching their own keys cost a thousand
times one node, not a million. Expiry is lazy:
every call first removes the keys whose deadline passed. A prefix waiter also sleeps on the
clock until the earliest deadline under its prefix, so an expiry wakes it at the expiry time
without any background task. Timeouts run on the same clock, so a test moves time for both.
On asyncio with a clock that sets timers (:class:`~aioelastic._clock.TimerClock`), a wait's
deadline is one timer that fires its signal as expired; other clocks bound it by a scope.

The synchronous ``*_nowait`` methods are the whole state machine; the async methods add only
waiting. The TCP server calls the synchronous ones directly on its hot path.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from aioelastic._clock import Clock, MonotonicClock, Timer, timer_clock
from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value, to_bytes
from aioelastic.store._errors import StoreClosedError, StoreTimeoutError, StoreValueError
from aioelastic.store._keyindex import Directory, KeyIndex, split

T = TypeVar("T")

_TOMBSTONE_SLACK = 1024
"""Deleted keys remembered (for change notification) beyond the number of live keys."""


@dataclass(frozen=True, slots=True)
class MemoryStoreStatistics:
    """A snapshot of a :class:`MemoryStore`."""

    keys: int
    revision: int
    expiring_keys: int
    tombstones: int
    """Deleted keys still remembered, so a waiter from an older revision sees the delete."""
    key_waiters: int
    change_waiters: int
    keys_examined: int = 0
    """Index entries looked at to answer prefix reads and change checks, since creation: with
    every node reading only its own keys it grows with the keys read, not with the store."""
    waiters_examined: int = 0
    """Prefix waiters looked at to find whom a change concerns, since creation."""
    wakeups: int = 0
    """Waiters woken by changes, since creation."""


Signal = asyncio.Future[bool] | anyio.Event
"""What one waiting call waits on: a bare future on asyncio (awaited by the call itself: no
Event, no wait coroutines, no per-Event deque), an anyio Event on other backends. A future
says why it was set: True for a change, False for its deadline (see :func:`expire`)."""


def new_signal() -> Signal:
    """A signal for one waiting call, of the running loop's kind."""
    loop = asyncio._get_running_loop()
    return loop.create_future() if loop is not None else anyio.Event()


def fire(signal: Signal) -> None:
    """Wake the call waiting on ``signal`` (a no-op once it woke or gave up)."""
    if isinstance(signal, asyncio.Future):
        if not signal.done():
            signal.set_result(True)
    else:
        signal.set()


def expire(signal: asyncio.Future[bool]) -> None:
    """Wake the call waiting on ``signal``: its deadline is reached (the signal's timer)."""
    if not signal.done():
        signal.set_result(False)


def fired(signal: Signal) -> bool:
    """Whether ``signal`` was fired by a change (not expired, nor given up on: a cancelled
    call cancels its future)."""
    if isinstance(signal, asyncio.Future):
        return signal.done() and not signal.cancelled() and signal.result()
    return signal.is_set()


def set_timer(clock: Clock, signal: Signal, deadline: float) -> Timer | None:
    """A timer on ``clock`` that expires ``signal`` at ``deadline``; None when the wait takes
    a scope instead (a clock without timers, or not on asyncio) or has no deadline."""
    if deadline == math.inf or not isinstance(signal, asyncio.Future):
        return None
    timers = timer_clock(clock)
    return None if timers is None else timers.call_at(deadline, expire, signal)


def wait_on(signal: Signal) -> Awaitable[object]:
    """What a call awaits until ``signal`` fires."""
    return signal if isinstance(signal, asyncio.Future) else signal.wait()


class Call(Coroutine[Any, None, T]):
    """A store call as one object: on its first step it runs ``function(*args)`` (the
    synchronous state machine) and yields to the loop once, the bare yield that
    ``anyio.lowlevel.checkpoint()`` comes down to on asyncio (``sleep(0)``); then it returns
    what ``function`` returned. Nothing runs before it is awaited, as with a coroutine (a
    :class:`~aioelastic.testing.FaultyStore` may close it unstarted).

    An ``async def`` call awaiting a checkpoint holds three objects (its coroutine, the
    ``sleep`` coroutine and its generator) while every other simulated node takes its turn,
    each living long enough to be promoted to the collector's oldest generation.
    """

    __slots__ = ("_args", "_function", "_state", "_store", "_value")

    def __init__(self, function: Callable[..., T], store: object, *args: Any) -> None:
        # The store apart from the arguments: a tuple of keys and values alone (str, bytes,
        # numbers) is one the collector stops tracking at its first pass, before promoting it.
        self._function, self._store, self._args, self._state = function, store, args, 0

    def __await__(self) -> Generator[Any, None, T]:
        return self  # type: ignore[return-value]  # its own iterator, as a coroutine is

    def __next__(self) -> None:
        return self.send(None)

    def send(self, _: None) -> None:
        if self._state == 0:
            self._state = 1
            self._value = self._function(self._store, *self._args)
            return  # the checkpoint
        if self._state == 1:
            self._state = 2
            raise StopIteration(self._value)
        raise RuntimeError("cannot reuse an already awaited store call")

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> None:
        self._state = 2
        raise typ if val is None else val

    def close(self) -> None:
        self._state = 2


def call(function: Callable[..., T], store: object, *args: Any) -> Coroutine[Any, Any, T]:
    """``function(store, *args)`` as a store call: run when awaited, then a checkpoint of the
    running loop's kind (:class:`Call` on asyncio)."""
    if asyncio._get_running_loop() is not None:
        return Call(function, store, *args)
    return _call_then_checkpoint(function, store, *args)


def checkpoint() -> Coroutine[Any, Any, None]:
    """:func:`anyio.lowlevel.checkpoint`, as one object on asyncio (see :class:`Call`)."""
    return call(_nothing, None)


def _nothing(_: object) -> None:
    return None


def _none(_: list[bytes]) -> None:
    """What ``wait`` returns of the values it waited for."""


def _first(values: list[bytes]) -> bytes:
    """What ``get`` returns of the values it waited for."""
    return values[0]


def _all(values: list[bytes]) -> list[bytes]:
    """What ``multi_get`` returns of the values it waited for."""
    return values


async def _call_then_checkpoint(function: Callable[..., T], store: object, *args: Any) -> T:
    value = function(store, *args)
    await anyio.lowlevel.checkpoint()
    return value


def check_ttl(ttl: float | None) -> None:
    """Raise ``ValueError`` unless ``ttl`` is None or a positive, finite number of seconds."""
    if ttl is not None and not (ttl > 0 and math.isfinite(ttl)):
        raise ValueError(f"ttl must be a positive, finite number of seconds, not {ttl!r}")


def check_key(key: object) -> str:
    """Return ``key`` if it is a str; raise ``TypeError`` naming its type otherwise."""
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, not {type(key).__name__}")
    return key


def parse_int(key: str, value: bytes) -> int:
    """Return the integer stored at ``key``, or raise :class:`StoreValueError`."""
    try:
        return int(value)
    except ValueError:
        raise StoreValueError(
            f"cannot add to {key!r}: it holds {value[:40]!r}, not a decimal integer; "
            "use a separate key for counters"
        ) from None


class MemoryStore(Store):
    """A :class:`Store` held in this process; the embedded default and the TCP server's core.

    ``clock`` drives TTL expiry and timeouts (default: the event loop's monotonic clock).
    """

    def __init__(self, *, clock: Clock | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.timeout = self.resolve_timeout(timeout)
        self._data: dict[str, bytes] = {}
        self._changed: dict[str, int] = {}  # key -> revision of its last change (incl. deletes)
        self._index = KeyIndex()  # the keys of _changed, by directory
        self._compacted = 0  # changes at or below this revision may have been forgotten
        self._revision = 0
        self._expiry: dict[str, float] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap; stale entries skipped lazily
        self._key_waiters: dict[str, set[Signal]] = {}  # by the missing key each waits for
        self._change_waiters: dict[str, list[tuple[str, Signal]]] = {}  # by directory
        self._closed = False
        self._waiters_examined = 0
        self._wakeups = 0

    @property
    def endpoint(self) -> str:
        return "memory"

    @property
    def revision(self) -> int:
        """The revision of the last mutation (0 for a fresh store)."""
        return self._revision

    def statistics(self) -> MemoryStoreStatistics:
        """Return a snapshot of the store's size and waiters."""
        return MemoryStoreStatistics(
            keys=len(self._data),
            revision=self._revision,
            expiring_keys=len(self._expiry),
            tombstones=len(self._changed) - len(self._data),
            key_waiters=sum(len(waiters) for waiters in self._key_waiters.values()),
            change_waiters=sum(len(waiters) for waiters in self._change_waiters.values()),
            keys_examined=self._index.examined,
            waiters_examined=self._waiters_examined,
            wakeups=self._wakeups,
        )

    # -- mutations: the only places that change state -------------------------------------

    def _changed_keys(self, keys: Sequence[str]) -> None:
        """Record a change of ``keys`` at the next revision and wake who waits on them."""
        self._revision += 1
        revision = self._revision
        changed, key_waiters = self._changed, self._key_waiters
        for key in keys:
            changed[key] = revision
            home = self._index.changed(key, revision)
            if key_waiters and key in self._data:
                woken = key_waiters.pop(key, None)
                if woken is not None:
                    self._wakeups += len(woken)
                    for signal in woken:
                        fire(signal)
            if self._change_waiters:
                self._wake_change_waiters(key, home)

    def _wake_change_waiters(self, key: str, home: Directory | None) -> None:
        """Wake the prefix waiters whose prefix ``key`` starts with: those registered in the
        key's directory or one of its ancestors."""
        change_waiters = self._change_waiters
        while home is not None:
            waiters = change_waiters.get(home.path)
            if waiters is not None:
                self._waiters_examined += len(waiters)
                kept = []
                for prefix, signal in waiters:
                    if key.startswith(prefix):
                        self._wakeups += 1
                        fire(signal)
                    else:
                        kept.append((prefix, signal))
                if kept:
                    change_waiters[home.path] = kept
                else:
                    del change_waiters[home.path]
            home = home.parent

    def _set_expiry(self, key: str, ttl: float | None) -> None:
        if ttl is None:
            self._expiry.pop(key, None)
            return
        deadline = self.clock.now() + ttl
        self._expiry[key] = deadline
        heapq.heappush(self._deadlines, (deadline, key))

    def _remove(self, key: str) -> None:
        del self._data[key]
        self._expiry.pop(key, None)

    def _compact(self) -> None:
        """Forget tombstones once they outnumber live keys by a margin; waiters re-read."""
        if len(self._changed) - len(self._data) <= len(self._data) + _TOMBSTONE_SLACK:
            return
        data, index = self._data, self._index
        for key in [key for key in self._changed if key not in data]:
            index.discard(key)
        self._changed = {key: rev for key, rev in self._changed.items() if key in data}
        self._compacted = self._revision

    def expire_due(self) -> None:
        """Remove every key whose TTL has run out (each removal is a change)."""
        if not self._deadlines:
            return
        now = self.clock.now()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, key = heapq.heappop(self._deadlines)
            if self._expiry.get(key) == deadline:
                self._remove(key)
                self._changed_keys((key,))
        self._compact()

    def _ready(self) -> None:
        """Refuse calls on a closed store; remove the keys whose TTL ran out."""
        if self._closed:
            raise StoreClosedError("the memory store was closed; create a new one")
        if self._deadlines:
            self.expire_due()

    # -- the synchronous state machine ----------------------------------------------------

    def set_nowait(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        """Synchronous :meth:`set`."""
        check_key(key)
        check_ttl(ttl)
        data = to_bytes(value)
        self._ready()
        self._data[key] = data
        self._set_expiry(key, ttl)
        self._changed_keys((key,))

    def get_nowait(self, keys: Sequence[str]) -> list[bytes] | None:
        """Return the values of ``keys``, or None if any is missing."""
        self._ready()
        data = self._data
        try:
            return [data[key] for key in keys]
        except KeyError:
            return None

    def add_nowait(self, key: str, amount: int) -> int:
        """Synchronous :meth:`add`."""
        check_key(key)
        if not isinstance(amount, int):
            raise TypeError(f"add amount must be an int, not {type(amount).__name__}")
        self._ready()
        old = self._data.get(key)
        total = amount + (parse_int(key, old) if old is not None else 0)
        self._data[key] = b"%d" % total
        self._changed_keys((key,))
        return total

    def compare_set_nowait(self, key: str, expected: Value, desired: Value) -> bytes:
        """Synchronous :meth:`compare_set`."""
        check_key(key)
        expected_bytes, desired_bytes = to_bytes(expected), to_bytes(desired)
        self._ready()
        current = self._data.get(key)
        if current is None and expected_bytes:
            return expected_bytes
        if current is not None and current != expected_bytes:
            return current
        self._data[key] = desired_bytes
        self._changed_keys((key,))
        return desired_bytes

    def check_nowait(self, keys: Sequence[str]) -> bool:
        """Synchronous :meth:`check`."""
        self._ready()
        data = self._data
        for key in keys:  # noqa: SIM110 (all() over a generator costs twice this loop)
            if key not in data:
                return False
        return True

    def delete_nowait(self, key: str) -> bool:
        """Synchronous :meth:`delete_key`."""
        self._ready()
        if key not in self._data:
            return False
        self._remove(key)
        self._changed_keys((key,))
        self._compact()
        return True

    def num_keys_nowait(self) -> int:
        """Synchronous :meth:`num_keys`."""
        self._ready()
        return len(self._data)

    def multi_set_nowait(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Synchronous :meth:`multi_set`: every key changes at one revision."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        pairs = [(check_key(key), to_bytes(value)) for key, value in zip(keys, values, strict=True)]
        self._ready()
        if not pairs:
            return
        for key, value in pairs:
            self._data[key] = value
            self._expiry.pop(key, None)
        self._changed_keys([key for key, _ in pairs])

    def append_nowait(self, key: str, value: Value) -> None:
        """Synchronous :meth:`append`."""
        check_key(key)
        data = to_bytes(value)
        self._ready()
        self._data[key] = self._data.get(key, b"") + data
        self._changed_keys((key,))

    def _set_ttl(self, key: str, value: Value, ttl: float | None) -> None:
        self.set_nowait(key, value, ttl=ttl)

    def _get_prefix_checked(self, prefix: str) -> Snapshot:
        return self.get_prefix_nowait(check_key(prefix))

    def get_prefix_nowait(self, prefix: str) -> Snapshot:
        """Synchronous :meth:`get_prefix`."""
        self._ready()
        data = self._data
        items = {key: data[key] for key in self._index.keys_under(prefix) if key in data}
        return Snapshot(self._revision, items)

    def ttl_remaining_nowait(self, key: str) -> float | None:
        """Synchronous :meth:`ttl_remaining`."""
        check_key(key)
        self._ready()
        deadline = self._expiry.get(key)
        return None if deadline is None else max(0.0, deadline - self.clock.now())

    def changed_since(self, prefix: str, after: int) -> bool:
        """Return whether a key under ``prefix`` changed at a revision above ``after``.

        Also true when that history was compacted away: the caller re-reads.
        """
        self._ready()
        if after >= self._revision:
            return False
        if after < self._compacted:
            return True
        return self._index.revision_under(prefix, self._changed) > after

    def _next_expiry(self, prefix: str) -> float:
        """The earliest TTL deadline of a key under ``prefix`` (``inf`` if none)."""
        expiry = self._expiry
        if not expiry:
            return math.inf
        return min(
            (expiry[key] for key in self._index.keys_under(prefix) if key in expiry),
            default=math.inf,
        )

    # -- waiting ----------------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> tuple[float, float]:
        resolved = self.resolve_timeout(timeout)
        return resolved, self.clock.now() + resolved

    async def _wait_keys(
        self, keys: Sequence[str], timeout: float | None, pick: Callable[[list[bytes]], T]
    ) -> T:
        """Wait until every key of ``keys`` exists; return ``pick(values)``: what the call
        returns, so that each waiting call is this one coroutine (no wrapper per call)."""
        for key in keys:
            check_key(key)
        resolved, deadline = self._deadline(timeout)
        waited = False
        while True:
            values = self.get_nowait(keys)
            if values is not None:
                if not waited:  # a call is a checkpoint even when it need not wait
                    await checkpoint()
                return pick(values)
            waited = True
            missing = next(key for key in keys if key not in self._data)
            signal = new_signal()
            self._key_waiters.setdefault(missing, set()).add(signal)
            timer = set_timer(self.clock, signal, deadline)
            try:
                if timer is not None or deadline == math.inf:  # waited here, not in a
                    # helper: a waiting call holds one coroutine fewer while every other
                    # simulated node waits too
                    await wait_on(signal)
                else:
                    with self.clock.move_on_at(deadline):
                        await wait_on(signal)
            finally:
                if timer is not None:
                    timer.cancel()
                if not fired(signal):
                    waiters = self._key_waiters.get(missing)
                    if waiters is not None:
                        waiters.discard(signal)
                        if not waiters:
                            del self._key_waiters[missing]
            if not fired(signal) and self.get_nowait(keys) is None:
                raise StoreTimeoutError(
                    [key for key in keys if key not in self._data], resolved, self.endpoint
                )

    # -- the Store contract -----------------------------------------------------------------

    def set(self, key: str, value: Value, *, ttl: float | None = None) -> Coroutine[Any, Any, None]:
        return call(MemoryStore._set_ttl, self, key, value, ttl)

    def get(self, key: str, *, timeout: float | None = None) -> Coroutine[Any, Any, bytes]:
        return self._wait_keys((key,), timeout, _first)

    def add(self, key: str, amount: int) -> Coroutine[Any, Any, int]:
        return call(MemoryStore.add_nowait, self, key, amount)

    def compare_set(self, key: str, expected: Value, desired: Value) -> Coroutine[Any, Any, bytes]:
        return call(MemoryStore.compare_set_nowait, self, key, expected, desired)

    def wait(
        self, keys: Sequence[str], *, timeout: float | None = None
    ) -> Coroutine[Any, Any, None]:
        return self._wait_keys(keys, timeout, _none)

    def check(self, keys: Sequence[str]) -> Coroutine[Any, Any, bool]:
        return call(MemoryStore.check_nowait, self, keys)

    def delete_key(self, key: str) -> Coroutine[Any, Any, bool]:
        return call(MemoryStore.delete_nowait, self, key)

    def num_keys(self) -> Coroutine[Any, Any, int]:
        return call(MemoryStore.num_keys_nowait, self)

    def multi_get(
        self, keys: Sequence[str], *, timeout: float | None = None
    ) -> Coroutine[Any, Any, list[bytes]]:
        return self._wait_keys(keys, timeout, _all)

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> Coroutine[Any, Any, None]:
        return call(MemoryStore.multi_set_nowait, self, keys, values)

    def append(self, key: str, value: Value) -> Coroutine[Any, Any, None]:
        return call(MemoryStore.append_nowait, self, key, value)

    def get_prefix(self, prefix: str) -> Coroutine[Any, Any, Snapshot]:
        return call(MemoryStore._get_prefix_checked, self, prefix)

    def ttl_remaining(self, key: str) -> Coroutine[Any, Any, float | None]:
        return call(MemoryStore.ttl_remaining_nowait, self, key)

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        check_key(prefix)
        resolved, deadline = self._deadline(timeout)
        path = split(prefix)[0]
        while not self.changed_since(prefix, after):
            signal = new_signal()
            waiter = (prefix, signal)
            self._change_waiters.setdefault(path, []).append(waiter)
            until = min(deadline, self._next_expiry(prefix))
            timer = set_timer(self.clock, signal, until)
            try:  # waited here, as in _wait_keys
                if timer is not None or until == math.inf:
                    await wait_on(signal)
                else:
                    with self.clock.move_on_at(until):
                        await wait_on(signal)
            finally:
                if timer is not None:
                    timer.cancel()
                if not fired(signal):
                    self._forget_change_waiter(path, waiter)
            # Not woken by a change: it reached the call's deadline, or a key's expiry (the
            # next check sees that change).
            if not fired(signal) and until >= deadline and not self.changed_since(prefix, after):
                raise StoreTimeoutError([f"{prefix}*"], resolved, self.endpoint)
        await checkpoint()
        return self._revision

    def _forget_change_waiter(self, path: str, waiter: tuple[str, Signal]) -> None:
        waiters = self._change_waiters.get(path)
        if waiters is not None and waiter in waiters:  # a change may have taken it already:
            waiters.remove(waiter)  # one that came after a cancel cancelled its future
            if not waiters:
                del self._change_waiters[path]

    async def aclose(self) -> None:
        """Refuse further calls; calls waiting now raise :class:`StoreClosedError`."""
        self._closed = True
        for key_waiters in self._key_waiters.values():
            for signal in key_waiters:
                fire(signal)
        for change_waiters in self._change_waiters.values():
            for _, signal in change_waiters:
                fire(signal)
        self._key_waiters.clear()
        self._change_waiters.clear()
        await checkpoint()
