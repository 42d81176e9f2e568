"""EtcdStore against a real etcd: what the conformance suite cannot check on other stores."""

from __future__ import annotations

import functools
import re
import urllib.request
from collections.abc import Awaitable, Iterator
from pathlib import Path

import anyio
import grpc
import pytest
from aetcd import rpc

from aioelastic.store import (
    EtcdLeaseLost,
    EtcdStore,
    EtcdStoreEvent,
    Store,
    StoreClosedError,
    StoreTimeoutError,
)
from aioelastic.testing import EtcdCluster
from tests.etcd_fixtures import start_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]

# etcd expires leases after at least 2 s of real time: run those tests on one loop only.
one_loop = pytest.mark.parametrize("anyio_backend", [("asyncio", {})], ids=["asyncio"])


async def test_keys_live_under_the_job_prefix(etcd_server: EtcdCluster, etcd_prefix: str) -> None:
    """Two prefixes on one etcd are two separate stores."""
    async with (
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix + "a") as a,
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix + "b") as b,
    ):
        await a.set("k", b"from a")
        assert await b.check(["k"]) is False
        assert await a.num_keys() == 1
        assert await b.num_keys() == 0


async def test_add_is_exactly_once_under_contention(etcd_store: Store) -> None:
    """Concurrent adds from many tasks each count once, and each sees a distinct total."""
    totals: list[int] = []

    async def adder() -> None:
        totals.append(await etcd_store.add("counter", 1))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(adder)
    assert sorted(totals) == list(range(1, 21))
    assert await etcd_store.get("counter") == b"20"


async def test_counted_writes_from_many_clients_never_conflict(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """Writes counted by key from separate clients at once each see a distinct count, 1..N:
    no compare to lose, so nothing retries (unlike an add)."""
    counts: list[int] = []
    async with (
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as a,
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as b,
    ):
        before = a.statistics().requests + b.statistics().requests

        async def writer(store: EtcdStore, node: int) -> None:
            counts.append(await store.multi_set_and_count([f"join/{node}"], [b"r"], prefix="join/"))

        async with anyio.create_task_group() as tg:
            for node in range(20):
                tg.start_soon(writer, (a, b)[node % 2], node)
        requests = a.statistics().requests + b.statistics().requests - before
    assert sorted(counts) == list(range(1, 21))
    assert requests <= 22  # at most one each, never a retry (a keep-alive may fall in between)


async def test_concurrent_counted_writes_on_one_client_share_transactions(
    etcd_store: EtcdStore,
) -> None:
    """Counted writes made at once through one client (each with the same doorbell key) are
    combined into shared transactions, and each still sees its own distinct count."""
    counts: list[int] = []
    before = etcd_store.statistics().requests

    async def writer(node: int) -> None:
        keys = [f"join/{node}", "bell"]
        counts.append(await etcd_store.multi_set_and_count(keys, [b"r", b"0"], prefix="join/"))

    async with anyio.create_task_group() as tg:
        for node in range(60):
            tg.start_soon(writer, node)
    assert sorted(counts) == list(range(1, 61))
    assert etcd_store.statistics().requests - before < 60
    assert (await etcd_store.get_prefix("join/")).items.keys() == {f"join/{n}" for n in range(60)}


async def test_counted_writes_that_read_share_transactions_and_see_every_write(
    etcd_store: EtcdStore,
) -> None:
    """Counted writes that also read a prefix, made at once through one client, share
    transactions; each gets a distinct count and a snapshot of the read prefix that holds its
    own write, taken at a revision at or after it."""
    results: list[tuple[int, int, dict[str, bytes]]] = []
    before = etcd_store.statistics().requests

    async def writer(node: int) -> None:
        keys = [f"join/{node}", f"state/{node}"]
        count, state = await etcd_store.multi_set_count_and_read(
            keys, [b"r", b"1"], prefix="join/", read="state/"
        )
        assert f"state/{node}" in state.items
        results.append((count, state.revision, state.items))

    async with anyio.create_task_group() as tg:
        for node in range(40):
            tg.start_soon(writer, node)
    assert sorted(count for count, _, _ in results) == list(range(1, 41))
    assert etcd_store.statistics().requests - before < 40
    last = (await etcd_store.get_prefix("state/")).revision
    assert all(revision <= last for _, revision, _ in results)


async def test_a_counted_read_whose_reply_is_lost_reads_at_the_write(
    etcd_store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A counted write that landed but whose reply was lost is not written twice: the count
    and the read prefix are read at the write's revision, so a later write does not show."""
    await etcd_store.set("state/latest", b"1")
    sender = etcd_store._counted_sender
    send = sender._txn
    lost: list[int] = []

    async def lose_reply(what: str, request: object, *, idempotent: bool = True) -> object:
        response = await send(what, request, idempotent=idempotent)
        if what == "multi_set_and_count" and not lost:
            lost.append(1)
            await etcd_store.set("state/latest", b"2")  # lands after the write, before the check
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "lost"
            )
        return response

    monkeypatch.setattr(sender, "_txn", lose_reply)
    count, state = await etcd_store.multi_set_count_and_read(
        ["join/a", "bell"], [b"r", b"0"], prefix="join/", read="state/"
    )
    assert lost
    assert count == 1
    assert state.items == {"state/latest": b"1"}
    assert (await etcd_store.get_prefix("join/")).items == {"join/a": b"r"}


async def test_get_prefixes_is_one_request_at_one_revision(etcd_store: EtcdStore) -> None:
    """Reading two prefixes costs one request, and both snapshots carry its revision."""
    await etcd_store.multi_set(["join/1", "node/1/alive"], [b"r", b"1"])
    before = etcd_store.statistics().requests
    joins, alive = await etcd_store.get_prefixes(["join/", "node/"])
    assert etcd_store.statistics().requests - before == 1
    assert (joins.items, alive.items) == ({"join/1": b"r"}, {"node/1/alive": b"1"})
    assert joins.revision == alive.revision == (await etcd_store.get_prefix("join/")).revision


@pytest.fixture
def own_etcd(etcd_binary: str, tmp_path: Path) -> Iterator[EtcdCluster]:
    """An etcd member of the test's own: no other test writes to it."""
    cluster = start_cluster(etcd_binary, tmp_path / "etcd", 1)
    yield cluster
    cluster.stop(timeout=1)


async def test_a_get_that_waits_takes_the_value_from_the_watch(own_etcd: EtcdCluster) -> None:
    """A get of a key that appears later costs one read and one watch, not a read again.

    On an etcd of its own, and the key is set only once etcd holds the get's watch: any write
    before that (another test's lease expiring on a shared etcd, or this set overtaking the
    watch's creation under load) makes the watch read the gap once and the get read the key
    again (CI counted 5). The store's own background requests (a watch's liveness probe every
    request timeout, the session's renewal every third of its TTL) are set beyond the test."""
    values: list[bytes] = []
    async with EtcdStore(
        own_etcd.endpoints, prefix="/t/", request_timeout=120, session_ttl=600
    ) as etcd_store:
        before = etcd_store.statistics().requests
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _append(values, etcd_store.get("late", timeout=60)))
            with anyio.fail_after(30):
                await _until_watched(own_etcd)
            await etcd_store.set("late", b"here")  # one request
        assert values == [b"here"]
        assert etcd_store.statistics().requests - before == 3


async def _until_watched(cluster: EtcdCluster) -> None:
    """Return once etcd holds a watcher (its metrics endpoint says so)."""
    url = f"http://{cluster.endpoints.split(',')[0]}/metrics"

    def read() -> bytes:
        with urllib.request.urlopen(url, timeout=5) as reply:
            data: bytes = reply.read()
            return data

    while True:
        text = (await anyio.to_thread.run_sync(read)).decode()
        found = re.search(r"^etcd_debugging_mvcc_watcher_total (\d+)", text, re.MULTILINE)
        assert found is not None, "etcd's metrics have no watcher count"
        if int(found.group(1)) >= 1:
            return
        # etcd's metrics give no notice of a change to wait on: read them again shortly
        await anyio.sleep(0.01)  # pace


async def _append(values: list[bytes], value: Awaitable[bytes]) -> None:
    values.append(await value)


@one_loop
async def test_add_keeps_the_keys_expiry(etcd_store: EtcdStore) -> None:
    """add on a TTL key keeps its lease: the key still expires."""
    await etcd_store.set("n", b"1", ttl=1)
    snapshot = await etcd_store.get_prefix("n")
    assert await etcd_store.add("n", 1) == 2
    revision = snapshot.revision
    with anyio.fail_after(20):
        while await etcd_store.check(["n"]):
            revision = await etcd_store.wait_for_change("n", after=revision)
    assert await etcd_store.check(["n"]) is False


@one_loop
async def test_ttl_key_expires_and_wakes_waiters(etcd_store: EtcdStore) -> None:
    """A key set with a ttl is deleted by etcd, which wakes wait_for_change."""
    await etcd_store.set("alive/node", b"1", ttl=1)
    snapshot = await etcd_store.get_prefix("alive/")
    assert snapshot.items == {"alive/node": b"1"}
    with anyio.fail_after(20):
        await etcd_store.wait_for_change("alive/", after=snapshot.revision)
    assert (await etcd_store.get_prefix("alive/")).items == {}


@pytest.mark.parametrize("writers", [1, 5])
@one_loop
async def test_rewriting_an_expired_ttl_key_reports_the_lost_lease(
    etcd_server: EtcdCluster, etcd_prefix: str, writers: int
) -> None:
    """A TTL key written again after it expired is restored under a new lease, and the lost
    lease is reported once, also when several keep-alives race on it (they share one lease)."""
    events: list[EtcdStoreEvent] = []
    endpoints = etcd_server.endpoints
    async with EtcdStore(endpoints, prefix=etcd_prefix, on_event=events.append) as store:
        await store.set("hb", b"1", ttl=1)
        snapshot = await store.get_prefix("hb")
        with anyio.fail_after(20):
            await store.wait_for_change("hb", after=snapshot.revision)
        async with anyio.create_task_group() as tg:
            for _ in range(writers):
                tg.start_soon(functools.partial(store.set, "hb", b"2", ttl=1))
        assert await store.get("hb", timeout=0) == b"2"
        assert await store.ttl_remaining("hb") is not None
    lost = [event for event in events if isinstance(event, EtcdLeaseLost)]
    assert [event.key for event in lost] == ["hb"]
    assert (store.statistics().leases_lost, store.statistics().ttl_leases) == (1, 1)


async def test_rewriting_a_live_ttl_key_renews_its_lease(etcd_store: EtcdStore) -> None:
    """Writing a TTL key again with the same ttl reuses (renews) its lease."""
    await etcd_store.set("hb", b"1", ttl=5)
    await etcd_store.set("hb", b"2", ttl=5)
    stats = etcd_store.statistics()
    assert (stats.ttl_leases, stats.leases_lost) == (1, 0)
    assert await etcd_store.get("hb") == b"2"


@one_loop
async def test_set_without_ttl_makes_a_ttl_key_permanent(etcd_store: EtcdStore) -> None:
    """A plain set detaches the key from its lease."""
    await etcd_store.set("k", b"1", ttl=1)
    await etcd_store.set("k", b"2")
    await etcd_store.set("other", b"x", ttl=1)
    snapshot = await etcd_store.get_prefix("other")
    with anyio.fail_after(20):
        await etcd_store.wait_for_change("other", after=snapshot.revision)
    assert await etcd_store.get("k", timeout=0) == b"2"


async def test_timeout_names_keys_and_endpoints(etcd_store: EtcdStore) -> None:
    """A wait that times out names the missing keys and the etcd endpoints."""
    await etcd_store.set("present", b"1")
    with pytest.raises(StoreTimeoutError, match=r"'missing' on etcd://127\.0\.0\.1:\d+/") as caught:
        await etcd_store.wait(["present", "missing"], timeout=0.2)
    assert caught.value.keys == ("missing",)


async def test_get_wakes_on_a_write_from_another_client(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """A get waiting on one client returns when another client writes the key."""
    async with (
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as reader,
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as writer,
    ):
        result: list[bytes] = []
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                result.append(await reader.get("late", timeout=30))

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            await writer.set("late", b"here")
        assert result == [b"here"]


async def test_use_before_open_and_after_close_is_refused(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """Calls outside ``async with`` raise StoreClosedError saying how to open the store."""
    store = EtcdStore(etcd_server.endpoints, prefix=etcd_prefix)
    with pytest.raises(StoreClosedError, match="is not open: use `async with EtcdStore"):
        await store.get("k", timeout=0)
    async with store:
        await store.set("k", b"v")
    with pytest.raises(StoreClosedError, match="was closed"):
        await store.get("k", timeout=0)


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [
        ("", "no etcd endpoint in ''"),
        ("host:port", "etcd endpoint 'host:port' has no valid port"),
        ("host:70000", "etcd endpoint 'host:70000' has no valid port"),
    ],
)
def test_bad_endpoints_are_refused(endpoints: str, message: str) -> None:
    """Malformed endpoint lists raise ValueError quoting the bad entry."""
    with pytest.raises(ValueError, match=message):
        EtcdStore(endpoints)


def test_endpoint_forms_are_normalised() -> None:
    """Schemes, spaces and missing ports are accepted and shown as host:port."""
    store = EtcdStore(" http://a:1, b ,https://c:3/", ca_cert=None)
    assert store.endpoint == "etcd://a:1,b:2379,c:3/aioelastic/default/"


def test_missing_tls_file_is_a_clear_error() -> None:
    """A CA path that does not exist is named in the error."""
    with pytest.raises(ValueError, match=r"TLS ca_cert file '/nonexistent/ca\.pem'"):
        EtcdStore("127.0.0.1:2379", ca_cert="/nonexistent/ca.pem")


def test_user_without_password_is_refused() -> None:
    """Authentication needs both the user and the password."""
    with pytest.raises(ValueError, match="needs both user and password"):
        EtcdStore("127.0.0.1:2379", user="root")


@one_loop
async def test_a_revoked_session_lease_is_reported_and_replaced(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """When the store's session lease disappears, the keepalive task reports it to the
    subscribers and starts a new session."""
    lost = anyio.Event()
    events: list[EtcdStoreEvent] = []

    def on_event(event: EtcdStoreEvent) -> None:
        events.append(event)
        if isinstance(event, EtcdLeaseLost):
            lost.set()

    unsubscribed: list[EtcdStoreEvent] = []
    async with EtcdStore(
        etcd_server.endpoints, prefix=etcd_prefix, session_ttl=3, on_event=on_event
    ) as store:
        store.subscribe(unsubscribed.append)()  # subscribed, then unsubscribed at once
        session = store.statistics().session_lease
        assert session is not None
        with grpc.insecure_channel(etcd_server.endpoints) as channel:
            rpc.LeaseStub(channel).LeaseRevoke(rpc.LeaseRevokeRequest(ID=session), timeout=10)
        with anyio.fail_after(30):
            await lost.wait()
        assert await store.add("n", 1) == 1
        assert store.statistics().session_lease not in (None, session)
    assert [(e.lease_id, e.key) for e in events if isinstance(e, EtcdLeaseLost)] == [
        (session, None)
    ]
    assert unsubscribed == []


async def test_wait_for_change_from_compacted_history_returns_early(
    etcd_server: EtcdCluster, etcd_store: EtcdStore
) -> None:
    """A wait from a revision etcd has compacted away returns (the caller re-reads)."""
    old = (await etcd_store.get_prefix("p/")).revision
    await etcd_store.set("other", b"1")
    await etcd_store.set("other", b"2")
    now = (await etcd_store.get_prefix("p/")).revision
    with grpc.insecure_channel(etcd_server.endpoints) as channel:
        rpc.KVStub(channel).Compact(rpc.CompactionRequest(revision=now), timeout=10)
    with anyio.fail_after(30):
        assert await etcd_store.wait_for_change("p/", after=old) >= now


async def test_an_add_costs_one_transaction_unless_the_key_surprises_it(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """An add does not read first: it starts from a missing key or the value this store last
    wrote, with fallbacks for other clients' adds; only a value outside them costs a retry."""
    async with (
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as store,
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as other,
    ):

        async def requests_for_add(expected: int) -> int:
            before = store.statistics().requests
            assert await store.add("n", 1) == expected
            return store.statistics().requests - before

        assert await requests_for_add(1) == 1  # a missing key
        assert await requests_for_add(2) == 1  # the value it wrote
        await other.add("n", 5)
        assert await requests_for_add(8) == 1  # 7 is among the fallbacks (2, 3, ..., 33)
        await other.set("n", b"1000")
        assert await requests_for_add(1001) == 2  # outside them: the key is read back


async def test_a_compare_set_costs_one_transaction_whether_it_swaps_or_not(
    etcd_store: EtcdStore,
) -> None:
    """compare_set does not read first: its transaction compares with the expected value and
    reads the key back itself when that differs."""

    async def requests_for(expected: bytes, desired: bytes, result: bytes) -> int:
        before = etcd_store.statistics().requests
        assert await etcd_store.compare_set("k", expected, desired) == result
        return etcd_store.statistics().requests - before

    assert await requests_for(b"", b"first", b"first") == 1  # a missing key, expected empty
    assert await requests_for(b"first", b"second", b"second") == 1  # swapped
    assert await requests_for(b"first", b"third", b"second") == 1  # not swapped: the value
    assert await etcd_store.get("k") == b"second"


async def test_a_burst_of_adds_is_combined(etcd_store: EtcdStore) -> None:
    """50 concurrent adds to one key take a few transactions, not one (or more) each."""
    before = etcd_store.statistics().requests
    totals: list[int] = []

    async def add() -> None:
        totals.append(await etcd_store.add("n", 2))

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(add)
    assert sorted(totals) == list(range(2, 101, 2))
    assert etcd_store.statistics().requests - before < 20


async def test_cancelling_calls_midway_is_clean(etcd_store: EtcdStore) -> None:
    """Deadlines that cancel store calls in flight end just those calls (gRPC's own
    cancellation never escapes the cancel scope), and the store stays usable."""
    cancelled = 0
    for i in range(60):
        with anyio.move_on_after(0.0005 * (i % 5)) as scope:
            await etcd_store.set("k", str(i))
            await etcd_store.add("n", 1)
            await etcd_store.wait_for_change("k", after=0)
        cancelled += scope.cancelled_caught
    assert cancelled > 0
    await etcd_store.set("k", b"after")
    assert await etcd_store.get("k") == b"after"


async def test_adds_cancelled_in_flight_never_wedge_later_ones(etcd_store: EtcdStore) -> None:
    """Deadlines that cancel adds at every point of their transaction leave the store able to
    add: each later add completes, and the counter only ever counts whole adds."""
    began = anyio.current_time()
    applied = await etcd_store.add("n", 1)
    step = (anyio.current_time() - began) / 10  # deadlines from 0 to 1.5 adds' time
    for i in range(200):
        with anyio.move_on_after(step * (i % 16)) as scope:
            await etcd_store.add("n", 1)
        applied += not scope.cancelled_caught
        with anyio.fail_after(10):
            total = int(await etcd_store.add("n", 0))
        assert applied <= total <= i + 2
