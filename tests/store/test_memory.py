"""MemoryStore beyond the shared contract: its core against a model, closing, compaction."""

from __future__ import annotations

import math

import anyio
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aioelastic.store import MemoryStore, PrefixStore, Store, StoreClosedError, StoreTimeoutError
from aioelastic.testing import ManualClock
from tests.clocks import RecordingClock, ScopeOnlyClock
from tests.store.conftest import Parked, WatchedClock

_keys = st.sampled_from(["a", "b", "p/a", "p/b", "p/q/a", "pa"])
_prefixes = st.sampled_from(["", "p/", "p", "a", "p/q/", "p/q", "x/"])
_values = st.binary(max_size=4)
_ttls = st.none() | st.sampled_from([0.5, 1.0, 2.5])


class MemoryStoreModel(RuleBasedStateMachine):
    """The synchronous core of MemoryStore behaves like a dict with deadlines."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.store = MemoryStore(clock=self.clock)
        self.model: dict[str, tuple[bytes, float | None]] = {}
        self.revision = 0

    def live(self) -> dict[str, bytes]:
        now = self.clock.now()
        return {
            k: v for k, (v, deadline) in self.model.items() if deadline is None or deadline > now
        }

    def mutated(self) -> None:
        assert self.store.revision > self.revision
        self.revision = self.store.revision

    @rule(key=_keys, value=_values, ttl=_ttls, prefix=_prefixes)
    def set(self, key: str, value: bytes, ttl: float | None, prefix: str) -> None:
        self.store.set_nowait(key, value, ttl=ttl)
        self.model[key] = (value, None if ttl is None else self.clock.now() + ttl)
        self.mutated()
        assert self.store.changed_since(prefix, self.revision - 1) == key.startswith(prefix)

    @rule(prefix=_prefixes)
    def get_prefix(self, prefix: str) -> None:
        live = self.live()
        expected = {k: v for k, v in live.items() if k.startswith(prefix)}
        assert self.store.get_prefix_nowait(prefix).items == expected

    @rule(key=_keys, amount=st.integers(-3, 3))
    def add(self, key: str, amount: int) -> None:
        current = self.live().get(key, b"0")
        if not current.lstrip(b"-").isdigit():
            return
        total = self.store.add_nowait(key, amount)
        assert total == int(current) + amount
        deadline = self.model[key][1] if key in self.live() else None
        self.model[key] = (str(total).encode(), deadline)
        self.mutated()

    @rule(key=_keys, expected=_values, desired=_values)
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> None:
        current = self.live().get(key)
        stored = self.store.compare_set_nowait(key, expected, desired)
        if (current is None and not expected) or current == expected:
            assert stored == desired
            deadline = self.model[key][1] if current is not None else None
            self.model[key] = (desired, deadline)
            self.mutated()
        else:
            assert stored == (expected if current is None else current)

    @rule(key=_keys, value=_values)
    def append(self, key: str, value: bytes) -> None:
        live = self.live()
        self.store.append_nowait(key, value)
        deadline = self.model[key][1] if key in live else None
        self.model[key] = (live.get(key, b"") + value, deadline)
        self.mutated()

    @rule(key=_keys)
    def delete(self, key: str) -> None:
        existed = key in self.live()
        assert self.store.delete_nowait(key) == existed
        self.model.pop(key, None)
        if existed:
            self.mutated()

    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0]))
    def advance(self, seconds: float) -> None:
        before = self.live()
        self.clock.advance(seconds)
        expired = set(before) - set(self.live())
        snapshot = self.store.get_prefix_nowait("")
        assert (snapshot.revision > self.revision) == bool(expired)
        self.revision = snapshot.revision

    @precondition(lambda self: self.revision > 0)
    @rule(prefix=_prefixes)
    def nothing_changed_since_now(self, prefix: str) -> None:
        assert not self.store.changed_since(prefix, self.store.revision)

    @invariant()
    def contents_match(self) -> None:
        live = self.live()
        assert self.store.get_prefix_nowait("").items == live
        assert self.store.num_keys_nowait() == len(live)


TestMemoryStoreModel = MemoryStoreModel.TestCase


@pytest.mark.anyio
async def test_closing_wakes_waiters_with_closed_error() -> None:
    """Calls parked in a store that is closed raise StoreClosedError, as do later calls."""
    clock = WatchedClock()
    store = MemoryStore(clock=clock)
    parked = Parked(clock)
    errors: list[StoreClosedError] = []

    async def waiter(call: str) -> None:
        try:
            if call == "get":
                await store.get("k")
            else:
                await store.wait_for_change("", after=0)
        except StoreClosedError as error:
            errors.append(error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "get")
        tg.start_soon(waiter, "wait_for_change")
        await parked.wait(2)
        await store.aclose()
    assert len(errors) == 2
    with pytest.raises(StoreClosedError, match="the memory store was closed"):
        await store.set("k", b"v")


@pytest.mark.anyio
async def test_default_clock_times_out_a_zero_timeout() -> None:
    """On the real monotonic clock, timeout=0 fails at once with the key named."""
    store = MemoryStore()
    with pytest.raises(StoreTimeoutError, match="after 0 s waiting for 'k' on memory"):
        await store.get("k", timeout=0)


def test_deleted_keys_are_forgotten_beyond_a_bound() -> None:
    """Tombstones of deleted keys are compacted, so churn does not grow memory without bound."""
    store = MemoryStore(clock=ManualClock())
    start = store.revision
    for i in range(5000):
        store.set_nowait(f"k{i}", b"v")
        store.delete_nowait(f"k{i}")
    assert store.statistics().tombstones <= 1025
    assert store.changed_since("unrelated/", start)  # history compacted: callers re-read


def test_statistics_count_keys_and_waiters() -> None:
    """statistics() is a snapshot of keys, expiring keys and revision."""
    store = MemoryStore(clock=ManualClock())
    store.set_nowait("a", b"1", ttl=5)
    store.set_nowait("b", b"2")
    stats = store.statistics()
    assert (stats.keys, stats.expiring_keys, stats.revision) == (2, 1, 2)
    assert (stats.key_waiters, stats.change_waiters) == (0, 0)


@pytest.mark.anyio
async def test_a_change_looks_only_at_the_waiters_of_its_directories() -> None:
    """A write wakes the prefix waiters above its key; waiters elsewhere are not looked at."""
    store = MemoryStore(clock=ManualClock())
    woken: list[str] = []
    async with anyio.create_task_group() as tg:

        async def watch(prefix: str) -> None:
            await store.wait_for_change(prefix, after=store.revision, timeout=math.inf)
            woken.append(prefix)

        for prefix in ("node/1/", "node/2/", "node/", "round/", "node/1/al"):
            tg.start_soon(watch, prefix)
        await anyio.wait_all_tasks_blocked()
        store.set_nowait("node/1/alive", b"1")
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    stats = store.statistics()
    assert sorted(woken) == ["node/", "node/1/", "node/1/al"]
    assert (stats.wakeups, stats.waiters_examined) == (3, 3)


class _StoreWithoutTTLReport(PrefixStore):
    """A store that keeps the contract's default ttl_remaining (as a third-party store would)."""

    ttl_remaining = Store.ttl_remaining


@pytest.mark.anyio
async def test_default_ttl_remaining_answers_missing_keys_and_refuses_the_rest() -> None:
    """The Store default says None for a missing key and NotImplementedError otherwise."""
    store = _StoreWithoutTTLReport("p", MemoryStore())
    await store.set("lease", b"1", ttl=10)
    assert await store.ttl_remaining("missing") is None
    with pytest.raises(NotImplementedError, match="cannot say how long a key's TTL has left"):
        await store.ttl_remaining("lease")


WAITS = {
    "get": lambda store, timeout: store.get("k", timeout=timeout),
    "wait": lambda store, timeout: store.wait(["here", "k"], timeout=timeout),
    "multi_get": lambda store, timeout: store.multi_get(["here", "k"], timeout=timeout),
    "wait_for_change": lambda store, timeout: store.wait_for_change(
        "k", after=store.revision, timeout=timeout
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("clocked", ["timers", "scope-only"])
@pytest.mark.parametrize("call", sorted(WAITS))
async def test_a_wait_that_times_out_raises_and_leaves_no_waiter(call: str, clocked: str) -> None:
    """A wait reaching its timeout raises StoreTimeoutError and leaves no waiter behind: none
    in the store, none on its clock (a timer clock's timer, or a user's clock's scope)."""
    clock = ManualClock() if clocked == "timers" else ScopeOnlyClock()
    store = MemoryStore(clock=clock)
    store.set_nowait("here", b"1")
    timed_out: list[StoreTimeoutError] = []

    async def waiter() -> None:
        with pytest.raises(StoreTimeoutError) as raised:
            await WAITS[call](store, 5.0)
        timed_out.append(raised.value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 1
        clock.advance(4.0)
        await anyio.wait_all_tasks_blocked()
        assert timed_out == []
        clock.advance(1.0)
    assert [error.timeout for error in timed_out] == [5.0]
    stats = store.statistics()
    assert (stats.key_waiters, stats.change_waiters, clock.sleepers) == (0, 0, 0)


@pytest.mark.anyio
async def test_a_wait_sets_a_timer_on_asyncio_and_a_scope_on_trio(anyio_backend: object) -> None:
    """On asyncio a timed wait is one timer on the clock (no cancel scope); on trio, a scope."""
    on_trio = (anyio_backend[0] if isinstance(anyio_backend, tuple) else anyio_backend) == "trio"
    clock = RecordingClock()
    store = MemoryStore(clock=clock)
    with pytest.raises(StoreTimeoutError):
        await store.get("k", timeout=0)
    with pytest.raises(StoreTimeoutError):
        await store.wait_for_change("", after=store.revision, timeout=0)
    assert clock.used == (["scope"] * 2 if on_trio else ["timer"] * 2)


@pytest.mark.anyio
async def test_a_key_set_as_the_timeout_is_reached_is_returned() -> None:
    """A wait whose deadline and key come in the same turn returns the value: the key is
    there when it looks again."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    got: list[bytes] = []

    async def waiter() -> None:
        got.append(await store.get("k", timeout=5.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        clock.advance(5.0)
        store.set_nowait("k", b"v")
    assert got == [b"v"]
    assert store.statistics().key_waiters == 0


@pytest.mark.anyio
async def test_a_wait_for_change_wakes_at_an_expiry_before_its_timeout() -> None:
    """A prefix wait wakes when a key under it expires (its deadline comes before the call's
    timeout): the expiry is a change; its timer is gone afterwards."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    store.set_nowait("p/lease", b"1", ttl=2.0)
    woke: list[int] = []

    async def waiter() -> None:
        woke.append(await store.wait_for_change("p/", after=store.revision, timeout=10.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        clock.advance(2.0)
    assert woke == [store.revision]
    assert store.get_prefix_nowait("p/").items == {}
    assert clock.sleepers == 0


@pytest.mark.anyio
@pytest.mark.parametrize("call", sorted(WAITS))
async def test_a_wait_woken_by_a_change_leaves_no_timer(call: str) -> None:
    """A wait that a change ends before its timeout drops its timer and its waiter."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    store.set_nowait("here", b"1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(WAITS[call], store, 5.0)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 1
        store.set_nowait("k", b"v")
    stats = store.statistics()
    assert (stats.key_waiters, stats.change_waiters, clock.sleepers) == (0, 0, 0)
