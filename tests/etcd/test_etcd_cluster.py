"""EtcdStore on a real 3-member etcd cluster whose members are killed and restarted."""

from __future__ import annotations

import functools
import signal

import anyio
import pytest

from aioelastic.store import EtcdFailover, EtcdStore, EtcdStoreEvent, StoreConnectionError
from aioelastic.testing import EtcdCluster, EtcdMember

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.etcd,
    # Real processes are killed here: one loop is enough (the store tests cover uvloop).
    pytest.mark.parametrize("anyio_backend", [("asyncio", {})], ids=["asyncio"]),
]


def member_at(cluster: EtcdCluster, address: str) -> EtcdMember:
    (member,) = [m for m in cluster.members if m.endpoint == address]
    return member


async def restart(cluster: EtcdCluster, member: EtcdMember) -> None:
    """Start a killed member again with its data directory and wait until it serves."""
    member.start()
    await anyio.to_thread.run_sync(cluster.wait_ready, [member])


async def test_watch_survives_its_member_being_killed_and_restarted(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """A waiter whose member is killed (and later restarted) misses none of the writes."""
    count = 12
    watcher_events: list[EtcdStoreEvent] = []
    async with (
        EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix, on_event=watcher_events.append) as w,
        EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix) as writer,
    ):
        seen: dict[str, bytes] = {}
        watching = anyio.Event()

        async def watch_all() -> None:
            revision = (await w.get_prefix("k/")).revision
            while len(seen) < count:
                watching.set()
                await w.wait_for_change("k/", after=revision, timeout=60)
                snapshot = await w.get_prefix("k/")
                seen.update(snapshot.items)
                revision = snapshot.revision

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_all)
                await watching.wait()
                await anyio.wait_all_tasks_blocked()
                victim = member_at(etcd_cluster, w.statistics().current_endpoint)
                victim.kill()  # the member holding the watch stream
                for i in range(count // 2):
                    await writer.set(f"k/{i}", str(i))
                await restart(etcd_cluster, victim)
                for i in range(count // 2, count):
                    await writer.set(f"k/{i}", str(i))
    assert seen == {f"k/{i}": str(i).encode() for i in range(count)}
    assert w.statistics().watches_resumed >= 1
    failed = {e.endpoint for e in watcher_events if isinstance(e, EtcdFailover)}
    assert victim.endpoint in failed


async def test_watch_moves_off_a_paused_member(etcd_cluster: EtcdCluster, etcd_prefix: str) -> None:
    """A waiter whose member is paused (SIGSTOP, stream open and silent) sees the next write."""
    first, *others = etcd_cluster.members
    elsewhere = ",".join(m.endpoint for m in others)
    seen: list[int] = []
    async with (
        EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix, request_timeout=1.0) as watcher,
        EtcdStore(elsewhere, prefix=etcd_prefix) as writer,
    ):
        revision = (await watcher.get_prefix("k/")).revision
        assert watcher.statistics().current_endpoint == first.endpoint
        try:
            # Generous, but below the minute grpc's keepalive took to notice in the chaos run.
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:

                    async def wait() -> None:
                        seen.append(await watcher.wait_for_change("k/", after=revision))

                    tg.start_soon(wait)
                    await anyio.wait_all_tasks_blocked()
                    first.signal(signal.SIGSTOP)
                    await writer.set("k/after-pause", b"1")
        finally:
            first.signal(signal.SIGCONT)
    (changed,) = seen
    assert changed > revision
    assert watcher.statistics().watches_resumed >= 1


async def test_adds_stay_exactly_once_when_the_leader_is_killed(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """Adds in flight while the leader dies each count exactly once (no lost or double add)."""
    adders, rounds = 8, 6
    totals: list[int] = []
    leader = etcd_cluster.leader()
    async with EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix) as store:
        started = anyio.Event()

        async def add_many() -> None:
            for _ in range(rounds):
                totals.append(await store.add("counter", 1))
                started.set()

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for _ in range(adders):
                    tg.start_soon(add_many)
                await started.wait()
                leader.kill()
        assert await store.get("counter") == str(adders * rounds).encode()
    assert sorted(totals) == list(range(1, adders * rounds + 1))


async def test_compare_set_decides_once_across_a_leader_kill(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """Of many compare_set claims racing a leader kill, exactly one wins."""
    claimants = 10
    async with EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix) as store:
        results: dict[int, bytes] = {}

        async def claim(i: int) -> None:
            results[i] = await store.compare_set("owner", b"", str(i))

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                etcd_cluster.leader().kill()
                for i in range(claimants):
                    tg.start_soon(claim, i)
        winner = await store.get("owner")
    assert set(results.values()) == {winner}
    assert sum(results[i] == str(i).encode() for i in results) == 1


async def test_unreachable_cluster_is_a_connection_error_naming_the_endpoints(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """With every member down, calls and waits give up after retry_timeout, naming endpoints."""
    store = EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix, retry_timeout=1.0)
    async with store:
        await store.set("k", b"v")
        await anyio.to_thread.run_sync(functools.partial(etcd_cluster.stop, timeout=1))
        pattern = "etcd://" + etcd_cluster.endpoints.replace(".", r"\.")
        with anyio.fail_after(60):
            with pytest.raises(StoreConnectionError, match=pattern + ".*check that the etcd"):
                await store.set("k", b"w")
            with pytest.raises(StoreConnectionError, match=pattern):
                await store.get("missing", timeout=30)
