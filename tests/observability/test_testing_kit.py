"""The public test kit: many rendezvous nodes in one loop, on a manual clock, with faults."""

from __future__ import annotations

import anyio
import pytest

from aioelastic.events import EventStream
from aioelastic.rendezvous import InvalidationReason, RendezvousTimeoutError
from aioelastic.store import MemoryStore, StoreConnectionError
from aioelastic.testing import EventRecorder, FaultyStore, ManualClock, RendezvousCluster

pytestmark = pytest.mark.anyio


async def test_a_full_cluster_completes_a_round_with_distinct_ranks() -> None:
    """max_nodes nodes complete one round at once, ranks 0..n-1, without time passing."""
    async with RendezvousCluster(3) as cluster:
        infos = await cluster.rendezvous()
        assert cluster.clock.now() == 0
    assert sorted(info.rank for info in infos) == [0, 1, 2]
    assert {info.world_size for info in infos} == {3}


async def test_a_partial_cluster_completes_after_the_last_call() -> None:
    """Below max_nodes, the round seals once last_call_timeout passed on the manual clock."""
    async with RendezvousCluster(2, min_nodes=2, max_nodes=4, last_call_timeout=30) as cluster:
        infos = await cluster.rendezvous()
        assert cluster.clock.now() >= 30
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_a_crashed_node_invalidates_the_survivors_round() -> None:
    """A node that dies without a goodbye is reported lost once its heartbeat TTL expires."""
    async with RendezvousCluster(3) as cluster:
        await cluster.rendezvous()
        survivor = cluster.nodes[0].handler
        await cluster.crash(cluster.nodes[2])
        await cluster.advance(cluster.settings.heartbeat_timeout + 1)
        with anyio.fail_after(5):  # generous: the verdict is already known
            verdict = await survivor.wait_round_invalidated()
    assert verdict.reason is InvalidationReason.PARTICIPANT_LOST


async def test_the_survivors_rendezvous_again_without_the_crashed_node() -> None:
    """After a crash, the remaining nodes form a smaller round (min_nodes allows it)."""
    async with RendezvousCluster(3, min_nodes=2) as cluster:
        await cluster.rendezvous()
        await cluster.crash(cluster.nodes[2])
        infos = await cluster.rendezvous(cluster.nodes[:2])
    assert sorted(info.rank for info in infos) == [0, 1]
    assert {info.world_size for info in infos} == {2}


async def test_an_expired_node_is_left_out_of_the_next_round() -> None:
    """expire() lets a node's TTL run out; a node joining later fills its place."""
    async with RendezvousCluster(2, min_nodes=2, max_nodes=3) as cluster:
        await cluster.rendezvous()
        await cluster.expire(cluster.nodes[1])
        newcomer = await cluster.add_node()
        infos = await cluster.rendezvous([cluster.nodes[0], newcomer])
    assert {info.world_size for info in infos} == {2}


async def test_a_join_below_min_nodes_times_out_on_the_manual_clock() -> None:
    """A lone node of a run needing two times out after join_timeout of manual time."""
    async with RendezvousCluster(1, min_nodes=2, join_timeout=60) as cluster:
        with pytest.raises(RendezvousTimeoutError, match="60"):
            await cluster.rendezvous()
        assert 60 <= cluster.clock.now() < 120


async def test_a_stalled_store_call_holds_the_round_until_released() -> None:
    """A stall on one node's result write keeps every node waiting; releasing it completes."""
    async with RendezvousCluster(2) as cluster:
        stall = cluster.nodes[1].store.stall("add")
        await cluster.start_join()
        with anyio.fail_after(5):  # generous: the call is held at once
            await stall.wait_held()
        await anyio.wait_all_tasks_blocked()
        assert all(node.joining for node in cluster.nodes)
        stall.release()
        infos = await cluster.wait_joined()
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_a_partition_fails_calls_in_flight_and_later_ones() -> None:
    """Partitioning a FaultyStore fails a waiting call and new calls; heal restores them."""
    store = FaultyStore(MemoryStore(clock=ManualClock()), name="node7")
    failures: list[BaseException] = []

    async def waiter() -> None:
        try:
            await store.get("never", timeout=1000)
        except StoreConnectionError as error:
            failures.append(error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        store.partition()
    with pytest.raises(StoreConnectionError, match="node7 is partitioned"):
        await store.set("k", b"v")
    store.heal()
    await store.set("k", b"v")
    assert await store.get("k") == b"v"
    assert len(failures) == 1
    assert store.statistics().failed == 2


async def test_a_faulty_store_passes_ttl_remaining_through_and_partitions_it() -> None:
    """ttl_remaining reaches the wrapped store, and fails like any call while partitioned."""
    clock = ManualClock()
    store = FaultyStore(MemoryStore(clock=clock), name="node7")
    await store.set("lease", b"1", ttl=10)
    clock.advance(3)
    assert await store.ttl_remaining("lease") == pytest.approx(7)
    store.partition()
    with pytest.raises(StoreConnectionError, match="node7 is partitioned"):
        await store.ttl_remaining("lease")


async def test_stalling_an_unknown_operation_is_refused() -> None:
    """stall() names the operations it accepts when given one that is not a store call."""
    store = FaultyStore(MemoryStore())
    with pytest.raises(ValueError, match="cannot stall \\['sett'\\]"):
        store.stall("sett")


async def test_a_graceful_leave_invalidates_the_round_without_time_passing() -> None:
    """A node leaving cleanly tells the round at once (no heartbeat wait)."""
    async with RendezvousCluster(2, min_nodes=1) as cluster:
        await cluster.rendezvous()
        await cluster.leave(cluster.nodes[1])
        with anyio.fail_after(5):  # generous: the leave is already written
            verdict = await cluster.nodes[0].handler.wait_round_invalidated()
        assert cluster.clock.now() == 0
    assert verdict.reason is InvalidationReason.PARTICIPANT_LOST


async def test_a_node_partitioned_past_its_heartbeat_keeps_its_handler_and_rejoins() -> None:
    """A partition longer than the lease fences the node's round, not its handler."""
    async with RendezvousCluster(2) as cluster:
        await cluster.rendezvous()
        node = cluster.nodes[1]
        cluster.partition(node)
        await cluster.advance(cluster.settings.heartbeat_timeout)
        with anyio.fail_after(5):  # generous: the lease lapsed on the manual clock
            verdict = await node.handler.wait_round_invalidated()
        cluster.heal(node)
        infos = await cluster.rendezvous()
        assert node.exit_error is None
    assert verdict.reason is InvalidationReason.FENCED
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_a_partition_shorter_than_the_lease_costs_the_round_nothing() -> None:
    """A blip (store calls failing for less than the lease) leaves every round valid."""
    async with RendezvousCluster(2) as cluster:
        await cluster.rendezvous()
        cluster.partition(cluster.nodes[1])
        await cluster.advance(cluster.settings.keep_alive_interval)
        cluster.heal(cluster.nodes[1])
        await cluster.advance(cluster.settings.heartbeat_timeout)
        assert [n.handler.statistics().invalidated for n in cluster.nodes] == [None, None]


async def test_a_partition_fails_a_stalled_call_too() -> None:
    """A call held by a stall fails with the partition, like any call in flight."""
    store = FaultyStore(MemoryStore(clock=ManualClock()))
    stall = store.stall()
    failures: list[BaseException] = []

    async def writer() -> None:
        try:
            await store.set("k", b"v")
        except StoreConnectionError as error:
            failures.append(error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        await stall.wait_held()
        store.partition()
    assert len(failures) == 1
    assert stall.held == 0
    store.heal()
    stall.release()
    assert not await store.check(["k"])


async def test_the_cluster_streams_every_nodes_rendezvous_events() -> None:
    """cluster.events carries each handler's joining and completion, named by node."""
    recorder = EventRecorder()
    async with RendezvousCluster(2) as cluster:
        cluster.events.subscribe(recorder)
        await cluster.rendezvous()
    completed = recorder.of("RoundCompleted")
    assert sorted(r.node for r in completed) == ["node0", "node1"]
    assert {r.source for r in recorder.records} == {"rendezvous"}
    assert sorted(r.event.rank for r in completed) == [0, 1]
    assert recorder.kinds().count("RoundJoining") == 2


async def test_two_tasks_can_wait_on_one_stall_and_one_recorder() -> None:
    """Concurrent waiters of wait_held() and wait_for() all wake."""
    store = FaultyStore(MemoryStore(clock=ManualClock()))
    stall = store.stall("set")
    recorder = EventRecorder()
    stream = EventStream(node="n")
    stream.subscribe(recorder)
    woke: list[str] = []

    async def wait_stall(name: str) -> None:
        await stall.wait_held()
        woke.append(name)

    async def wait_record(name: str) -> None:
        await recorder.wait_for("int")
        woke.append(name)

    with anyio.fail_after(5):  # generous: everything happens without waiting
        async with anyio.create_task_group() as tg:
            for name in ("s1", "s2"):
                tg.start_soon(wait_stall, name)
            for name in ("r1", "r2"):
                tg.start_soon(wait_record, name)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(store.set, "k", b"v")
            stream.publish("test", 7)
            await anyio.wait_all_tasks_blocked()
            stall.release()
    assert sorted(woke) == ["r1", "r2", "s1", "s2"]
