"""The Store contract, checked on every backend in ``conftest.BACKENDS``."""

from __future__ import annotations

import math

import anyio
import pytest

from aioelastic.store import (
    Store,
    StoreClosedError,
    StoreError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.testing import ManualClock
from tests.store.conftest import Parked

pytestmark = pytest.mark.anyio


# -- plain reads and writes ------------------------------------------------------------------


async def test_set_then_get_returns_the_bytes(store: Store) -> None:
    """A value written with set is read back unchanged."""
    await store.set("k", b"\x00\xffbytes")
    assert await store.get("k") == b"\x00\xffbytes"


async def test_str_values_are_stored_as_utf8(store: Store) -> None:
    """A str value is encoded as UTF-8."""
    await store.set("k", "héllo")
    assert await store.get("k") == "héllo".encode()


async def test_set_overwrites(store: Store) -> None:
    """A second set replaces the first value."""
    await store.set("k", b"one")
    await store.set("k", b"two")
    assert await store.get("k") == b"two"


async def test_empty_value_is_a_value(store: Store) -> None:
    """An empty value exists: get returns it and check sees it."""
    await store.set("k", b"")
    assert await store.get("k") == b""
    assert await store.check(["k"])


async def test_non_bytes_value_is_refused(store: Store) -> None:
    """A value that is neither bytes nor str raises TypeError naming its type."""
    with pytest.raises(TypeError, match="bytes or str, not int"):
        await store.set("k", 5)  # type: ignore[arg-type]


async def test_add_counts_from_zero_and_returns_the_sum(store: Store) -> None:
    """add on a missing key starts from 0; each add returns the new total."""
    assert await store.add("n", 3) == 3
    assert await store.add("n", -5) == -2
    assert await store.get("n") == b"-2"


async def test_add_to_a_set_integer(store: Store) -> None:
    """add continues from an integer written with set."""
    await store.set("n", "40")
    assert await store.add("n", 2) == 42


async def test_add_to_a_non_integer_is_a_value_error(store: Store) -> None:
    """add on a value that is not a decimal integer raises StoreValueError naming the key."""
    await store.set("n", b"abc")
    with pytest.raises(StoreValueError, match=r"cannot add to '(job/)?n': it holds b'abc'"):
        await store.add("n", 1)
    assert await store.get("n") == b"abc"


async def test_compare_set_on_missing_key_with_empty_expected_sets(store: Store) -> None:
    """A missing key with empty expected is set to desired, which is returned."""
    assert await store.compare_set("k", b"", b"new") == b"new"
    assert await store.get("k") == b"new"


async def test_compare_set_on_missing_key_with_expected_stores_nothing(store: Store) -> None:
    """A missing key with non-empty expected stays missing; expected is returned."""
    assert await store.compare_set("k", b"old", b"new") == b"old"
    assert not await store.check(["k"])


async def test_compare_set_matching_value_swaps(store: Store) -> None:
    """When the key holds expected, desired is stored and returned."""
    await store.set("k", b"old")
    assert await store.compare_set("k", "old", "new") == b"new"
    assert await store.get("k") == b"new"


async def test_compare_set_mismatch_returns_current_value(store: Store) -> None:
    """When the key holds something else, nothing changes and the current value is returned."""
    await store.set("k", b"current")
    assert await store.compare_set("k", b"other", b"new") == b"current"
    assert await store.get("k") == b"current"


async def test_check_is_true_only_when_all_keys_exist(store: Store) -> None:
    """check answers for the whole list, without waiting."""
    await store.set("a", b"1")
    assert await store.check(["a"])
    assert not await store.check(["a", "b"])
    assert await store.check([])


async def test_delete_key_reports_whether_it_existed(store: Store) -> None:
    """delete_key returns True once and False after that; the key is gone."""
    await store.set("k", b"v")
    assert await store.delete_key("k")
    assert not await store.delete_key("k")
    assert not await store.check(["k"])


async def test_num_keys_counts_live_keys(store: Store) -> None:
    """num_keys goes up with new keys and down with deletes, not with overwrites."""
    start = await store.num_keys()
    await store.set("a", b"1")
    await store.set("b", b"2")
    await store.set("a", b"3")
    assert await store.num_keys() == start + 2
    await store.delete_key("a")
    assert await store.num_keys() == start + 1


async def test_multi_set_then_multi_get_keeps_order(store: Store) -> None:
    """multi_get returns values in the order of the keys asked for."""
    await store.multi_set(["a", "b", "c"], [b"1", "2", b"3"])
    assert await store.multi_get(["c", "a", "b"]) == [b"3", b"1", b"2"]


async def test_multi_set_with_mismatched_lengths_is_refused(store: Store) -> None:
    """multi_set with more keys than values raises ValueError and writes nothing."""
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        await store.multi_set(["a", "b"], [b"1"])
    assert not await store.check(["a"])


async def test_multi_set_and_count_counts_the_prefix_with_its_own_writes(store: Store) -> None:
    """Where a store counts keys as it writes, the count is of the keys under the prefix once
    the new ones are written (keys outside it are written, not counted); elsewhere the call
    is refused and writes nothing."""
    await store.set("join/a", b"1")
    if not store.counts_keys:
        with pytest.raises(NotImplementedError, match="cannot count keys as it writes"):
            await store.multi_set_and_count(["join/b"], [b"2"], prefix="join/")
        assert not await store.check(["join/b"])
        return
    count = await store.multi_set_and_count(["join/b", "bell"], [b"2", "0"], prefix="join/")
    assert count == 2
    assert await store.multi_get(["join/b", "bell"]) == [b"2", b"0"]
    assert await store.multi_set_and_count(["join/b"], [b"3"], prefix="join/") == 2


async def test_get_prefixes_reads_each_prefix_in_order(store: Store) -> None:
    """get_prefixes returns what get_prefix returns for each prefix, in the order asked (an
    empty prefix read included), at revisions no older than the writes before it."""
    await store.multi_set(["a/1", "a/2", "b/1"], [b"x", b"y", b"z"])
    written = (await store.get_prefix("")).revision
    got = await store.get_prefixes(["b/", "none/", "a/"])
    assert [snapshot.items for snapshot in got] == [
        {"b/1": b"z"},
        {},
        {"a/1": b"x", "a/2": b"y"},
    ]
    assert all(snapshot.revision >= written for snapshot in got)


async def test_multi_set_count_and_read_reads_in_the_same_step(store: Store) -> None:
    """Where a store counts keys as it writes, multi_set_count_and_read also returns the keys
    under ``read`` as they are once the new ones are written (the write's own among them);
    elsewhere it is refused and writes nothing."""
    await store.set("state/latest", b"4")
    if not store.counts_keys:
        with pytest.raises(NotImplementedError, match="cannot count keys as it writes"):
            await store.multi_set_count_and_read(["join/b"], [b"2"], prefix="join/", read="state/")
        assert not await store.check(["join/b"])
        return
    count, state = await store.multi_set_count_and_read(
        ["join/b", "state/seen"], [b"2", b"1"], prefix="join/", read="state/"
    )
    assert count == 1
    assert state.items == {"state/latest": b"4", "state/seen": b"1"}
    assert state.revision == (await store.get_prefix("state/")).revision


async def test_multi_set_and_count_with_mismatched_lengths_is_refused(store: Store) -> None:
    """multi_set_and_count with more keys than values raises ValueError, writes nothing."""
    if not store.counts_keys:
        pytest.skip(f"{store.endpoint} does not count keys as it writes")
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        await store.multi_set_and_count(["join/a", "b"], [b"1"], prefix="join/")
    assert not await store.check(["join/a"])


async def test_append_concatenates_and_creates(store: Store) -> None:
    """append on a missing key creates it; later appends concatenate."""
    await store.append("log", b"a")
    await store.append("log", "b")
    assert await store.get("log") == b"ab"


async def test_get_prefix_returns_only_matching_keys(store: Store) -> None:
    """get_prefix returns exactly the keys that start with the prefix."""
    await store.multi_set(["p/a", "p/b", "q/a"], [b"1", b"2", b"3"])
    snapshot = await store.get_prefix("p/")
    assert snapshot.items == {"p/a": b"1", "p/b": b"2"}


async def test_every_mutation_advances_the_revision(store: Store) -> None:
    """set, add, append, compare_set, multi_set and delete each advance the revision."""
    revisions = [(await store.get_prefix("")).revision]
    for mutate in (
        store.set("k", b"1"),
        store.add("n", 1),
        store.append("k", b"2"),
        store.compare_set("k", b"12", b"3"),
        store.multi_set(["x", "y"], [b"1", b"2"]),
        store.delete_key("x"),
    ):
        await mutate
        revisions.append((await store.get_prefix("")).revision)
    assert revisions == sorted(set(revisions))


# -- waiting ---------------------------------------------------------------------------------


async def test_get_waits_until_the_key_is_set(store: Store, store_clock: ManualClock) -> None:
    """A get started before the set returns the value once it is written."""
    parked = Parked(store_clock)
    async with anyio.create_task_group() as tg:
        results: list[bytes] = []

        async def getter() -> None:
            results.append(await store.get("late"))

        tg.start_soon(getter)
        await parked.wait()
        await store.set("late", b"here")
    assert results == [b"here"]


async def test_get_timeout_names_key_timeout_and_endpoint(
    store: Store, store_clock: ManualClock
) -> None:
    """A get that sees nothing within its timeout raises StoreTimeoutError (a TimeoutError)."""
    parked = Parked(store_clock)
    async with anyio.create_task_group() as tg:
        errors: list[BaseException] = []

        async def getter() -> None:
            try:
                await store.get("never", timeout=7.5)
            except StoreTimeoutError as error:
                errors.append(error)

        tg.start_soon(getter)
        await parked.wait()
        store_clock.advance(7.4)
        await anyio.wait_all_tasks_blocked()
        assert errors == []
        store_clock.advance(0.1)
    [error] = errors
    assert isinstance(error, TimeoutError)
    assert isinstance(error, StoreError)
    assert "after 7.5 s waiting for 'never'" in str(error)
    assert store.endpoint in str(error)


async def test_zero_timeout_fails_at_once_for_a_missing_key(store: Store) -> None:
    """timeout=0 does not wait: a missing key times out immediately."""
    with pytest.raises(StoreTimeoutError, match="after 0 s waiting for 'missing'"):
        await store.get("missing", timeout=0)


async def test_zero_timeout_returns_an_existing_key(store: Store) -> None:
    """timeout=0 still returns a key that exists."""
    await store.set("k", b"v")
    assert await store.get("k", timeout=0) == b"v"


async def test_negative_timeout_is_refused(store: Store) -> None:
    """A negative timeout is a misuse and raises ValueError."""
    with pytest.raises(ValueError, match="non-negative number of seconds, not -1"):
        await store.get("k", timeout=-1)


async def test_wait_timeout_names_only_missing_keys(store: Store) -> None:
    """A wait that times out names the keys still missing, not those present."""
    await store.set("here", b"1")
    with pytest.raises(StoreTimeoutError, match="waiting for 'gone'") as caught:
        await store.wait(["here", "gone"], timeout=0)
    assert caught.value.keys == ("gone",)


async def test_wait_returns_once_all_keys_exist(store: Store, store_clock: ManualClock) -> None:
    """wait returns only after the last of its keys is written."""
    parked = Parked(store_clock)
    done = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def waiter() -> None:
            await store.wait(["a", "b"])
            done.set()

        tg.start_soon(waiter)
        await parked.wait()
        await store.set("a", b"1")
        await parked.wait(2)
        assert not done.is_set()
        await store.set("b", b"2")
    assert done.is_set()


async def test_multi_get_waits_for_every_key(store: Store, store_clock: ManualClock) -> None:
    """multi_get returns once all its keys exist, values in order."""
    parked = Parked(store_clock)
    async with anyio.create_task_group() as tg:
        results: list[list[bytes]] = []

        async def getter() -> None:
            results.append(await store.multi_get(["x", "y"]))

        tg.start_soon(getter)
        await parked.wait()
        await store.multi_set(["y", "x"], [b"Y", b"X"])
    assert results == [[b"X", b"Y"]]


async def test_many_waiters_are_woken_by_one_set(store: Store, store_clock: ManualClock) -> None:
    """Twenty concurrent gets on one key all return after a single set."""
    parked = Parked(store_clock)
    results: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def getter() -> None:
            results.append(await store.get("go"))

        for _ in range(20):
            tg.start_soon(getter)
        await parked.wait(20)
        await store.set("go", b"!")
    assert results == [b"!"] * 20


async def test_cancelled_waiter_does_not_disturb_others(
    store: Store, store_clock: ManualClock
) -> None:
    """Cancelling one waiting get leaves another waiting get on the same key working."""
    parked = Parked(store_clock)
    results: list[bytes] = []
    doomed = anyio.CancelScope()
    async with anyio.create_task_group() as tg:

        async def cancelled_getter() -> None:
            with doomed:
                await store.get("k")

        async def getter() -> None:
            results.append(await store.get("k"))

        tg.start_soon(cancelled_getter)
        tg.start_soon(getter)
        await parked.wait(2)
        doomed.cancel()
        await anyio.wait_all_tasks_blocked()
        await store.set("k", b"v")
    assert results == [b"v"]


CALLS_ON_PRESENT_KEYS = {
    "get": lambda store: store.get("k"),
    "multi_get": lambda store: store.multi_get(["k", "j"]),
    "wait": lambda store: store.wait(["k", "j"]),
    "check": lambda store: store.check(["k"]),
    "get_prefix": lambda store: store.get_prefix("k"),
    "num_keys": lambda store: store.num_keys(),
    "add": lambda store: store.add("n", 1),
    "set": lambda store: store.set("k", b"again"),
}


@pytest.mark.parametrize("name", CALLS_ON_PRESENT_KEYS)
async def test_every_call_is_a_checkpoint_even_when_it_need_not_wait(
    store: Store, name: str
) -> None:
    """A call that can answer at once still yields to the loop, so a pending cancellation is
    delivered (a loop polling a present key cannot hold the event loop)."""
    await store.multi_set(["k", "j"], [b"v", b"w"])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await CALLS_ON_PRESENT_KEYS[name](store)
    assert scope.cancelled_caught


# -- change notification ---------------------------------------------------------------------


async def test_wait_for_change_sees_a_write_made_before_it_was_called(store: Store) -> None:
    """A change after the read revision is seen even if it happened before the wait began."""
    snapshot = await store.get_prefix("p/")
    await store.set("p/a", b"1")
    revision = await store.wait_for_change("p/", after=snapshot.revision, timeout=0)
    assert revision > snapshot.revision


async def test_wait_for_change_wakes_on_a_write(store: Store, store_clock: ManualClock) -> None:
    """A parked wait_for_change returns when a key under its prefix is written."""
    parked = Parked(store_clock)
    start = (await store.get_prefix("p/")).revision
    results: list[int] = []
    async with anyio.create_task_group() as tg:

        async def watcher() -> None:
            results.append(await store.wait_for_change("p/", after=start))

        tg.start_soon(watcher)
        await parked.wait()
        await store.set("p/a", b"1")
    assert results == [(await store.get_prefix("p/")).revision]


async def test_wait_for_change_wakes_on_a_delete(store: Store, store_clock: ManualClock) -> None:
    """Deleting a key under the prefix is a change."""
    await store.set("p/a", b"1")
    parked = Parked(store_clock)
    start = (await store.get_prefix("p/")).revision
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: store.wait_for_change("p/", after=start))
        await parked.wait()
        assert await store.delete_key("p/a")
    assert (await store.get_prefix("p/")).items == {}


async def test_wait_for_change_ignores_other_prefixes(
    store: Store, store_clock: ManualClock
) -> None:
    """Writes outside the prefix do not wake the waiter; its timeout still applies."""
    parked = Parked(store_clock)
    start = (await store.get_prefix("p/")).revision
    async with anyio.create_task_group() as tg:
        errors: list[StoreTimeoutError] = []

        async def watcher() -> None:
            try:
                await store.wait_for_change("p/", after=start, timeout=5)
            except StoreTimeoutError as error:
                errors.append(error)

        tg.start_soon(watcher)
        await parked.wait()
        await store.set("q/a", b"1")
        await store.set("p", b"no slash: not under 'p/'")
        await anyio.wait_all_tasks_blocked()
        assert errors == []
        store_clock.advance(5)
    [error] = errors
    assert "after 5 s waiting for 'p/*'" in str(error)


async def test_wait_for_change_with_current_revision_and_zero_timeout_times_out(
    store: Store,
) -> None:
    """Nothing changed after the current revision, so a zero-timeout wait times out."""
    await store.set("p/a", b"1")
    revision = (await store.get_prefix("p/")).revision
    with pytest.raises(StoreTimeoutError, match="waiting for 'p/\\*'"):
        await store.wait_for_change("p/", after=revision, timeout=0)


# -- TTL -------------------------------------------------------------------------------------


async def test_ttl_key_expires_exactly_at_its_deadline(
    store: Store, store_clock: ManualClock
) -> None:
    """A key set with ttl=10 exists at t=9.9 and is gone at t=10."""
    await store.set("lease", b"me", ttl=10)
    store_clock.advance(9.9)
    assert await store.get("lease", timeout=0) == b"me"
    store_clock.advance(0.1)
    assert not await store.check(["lease"])


async def test_rewriting_with_ttl_extends_the_deadline(
    store: Store, store_clock: ManualClock
) -> None:
    """A keep-alive (set again with ttl) moves the expiry forward."""
    await store.set("lease", b"1", ttl=10)
    store_clock.advance(8)
    await store.set("lease", b"2", ttl=10)
    store_clock.advance(8)
    assert await store.get("lease", timeout=0) == b"2"
    store_clock.advance(2)
    assert not await store.check(["lease"])


async def test_set_without_ttl_makes_the_key_permanent(
    store: Store, store_clock: ManualClock
) -> None:
    """A plain set after a TTL set removes the expiry."""
    await store.set("k", b"1", ttl=1)
    await store.set("k", b"2")
    store_clock.advance(100)
    assert await store.get("k", timeout=0) == b"2"


async def test_add_and_append_keep_the_expiry(store: Store, store_clock: ManualClock) -> None:
    """add and append modify the value but not when it expires."""
    await store.set("n", b"1", ttl=5)
    await store.add("n", 1)
    await store.append("n", b"0")
    store_clock.advance(5)
    assert not await store.check(["n"])


async def test_expiry_counts_as_a_change(store: Store, store_clock: ManualClock) -> None:
    """After an expiry, wait_for_change from an earlier revision returns."""
    await store.set("p/a", b"1", ttl=3)
    start = (await store.get_prefix("p/")).revision
    store_clock.advance(3)
    assert await store.wait_for_change("p/", after=start, timeout=0) > start


async def test_expiry_wakes_a_parked_change_waiter_at_the_expiry_time(
    store: Store, store_clock: ManualClock
) -> None:
    """A waiter parked on a prefix wakes when a key under it expires, with no other call."""
    await store.set("p/a", b"1", ttl=3)
    start = (await store.get_prefix("p/")).revision
    parked = Parked(store_clock)
    woke = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def watcher() -> None:
            await store.wait_for_change("p/", after=start)
            woke.set()

        tg.start_soon(watcher)
        await parked.wait()
        store_clock.advance(2.9)
        await anyio.wait_all_tasks_blocked()
        assert not woke.is_set()
        store_clock.advance(0.1)
        with anyio.fail_after(10):
            await woke.wait()
    assert (await store.get_prefix("p/")).items == {}


async def test_ttl_remaining_counts_down_on_the_store_clock(
    store: Store, store_clock: ManualClock
) -> None:
    """ttl_remaining says how long a TTL key has left; a keep-alive resets it."""
    await store.set("lease", b"1", ttl=10)
    assert await store.ttl_remaining("lease") == pytest.approx(10)
    store_clock.advance(4)
    assert await store.ttl_remaining("lease") == pytest.approx(6)
    await store.set("lease", b"2", ttl=10)
    assert await store.ttl_remaining("lease") == pytest.approx(10)
    store_clock.advance(10)
    assert await store.ttl_remaining("lease") is None


async def test_ttl_remaining_is_none_for_missing_or_permanent_keys(store: Store) -> None:
    """A missing key and a key without TTL have no remaining TTL."""
    await store.set("permanent", b"1")
    assert await store.ttl_remaining("missing") is None
    assert await store.ttl_remaining("permanent") is None


async def test_ttl_remaining_is_at_most_the_ttl(store: Store) -> None:
    """A fresh TTL key has between 0 and its TTL left (any backend, real clock)."""
    await store.set("lease", b"1", ttl=60)
    remaining = await store.ttl_remaining("lease")
    assert remaining is not None
    assert 0 < remaining <= 60


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan])
async def test_invalid_ttl_is_refused(store: Store, ttl: float) -> None:
    """ttl must be a positive, finite number of seconds."""
    with pytest.raises(ValueError, match="ttl must be a positive, finite number"):
        await store.set("k", b"v", ttl=ttl)
    assert not await store.check(["k"])


# -- closing ---------------------------------------------------------------------------------


async def test_aclose_from_another_task_fails_the_waiting_calls(
    store: Store, store_backend: str
) -> None:
    """aclose() from a task other than the one that opened the store is safe: a call waiting
    in it raises StoreClosedError, later calls too, and the opener's exit stays clean."""
    if store_backend == "prefix":
        pytest.skip("a PrefixStore is a view: its aclose() leaves the store it views open")
    outcome: list[BaseException] = []

    async def waiter() -> None:
        try:
            await store.get("never-set", timeout=60)
        except StoreClosedError as error:
            outcome.append(error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()  # the get is parked in the store
        tg.start_soon(store.aclose)
    assert [type(error) for error in outcome] == [StoreClosedError]
    with pytest.raises(StoreClosedError):
        await store.set("k", b"v")
