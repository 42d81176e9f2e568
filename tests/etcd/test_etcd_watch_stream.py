"""EtcdStore's one Watch stream a member, against a real etcd: many watches on it, ids freed
when a wait ends, every watch re-created when the stream dies, compaction ending one wait."""

from __future__ import annotations

import functools
import re
import urllib.request
from collections.abc import Awaitable, Callable

import anyio
import grpc
import pytest
from aetcd import rpc

from aioelastic.store import EtcdStore
from aioelastic.testing import EtcdCluster, EtcdMember

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


def _gauges(member: EtcdMember) -> tuple[int, int]:
    """etcd's own count of its watch streams and of its watchers (its /metrics page)."""
    with urllib.request.urlopen(f"{member.client_url}/metrics", timeout=10) as page:
        text = page.read().decode()

    def gauge(name: str) -> int:
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert found is not None, f"etcd has no {name} gauge"
        return int(float(found.group(1)))

    streams = gauge("etcd_debugging_mvcc_watch_stream_total")
    return streams, gauge("etcd_debugging_mvcc_watcher_total")


async def gauges(member: EtcdMember) -> tuple[int, int]:
    return await anyio.to_thread.run_sync(_gauges, member)


async def until(condition: Callable[[], Awaitable[bool] | bool]) -> None:
    """Return once ``condition()`` holds (within 10 s): etcd's gauges and the stream's ids
    settle after the replies a test can wait on."""
    with anyio.fail_after(10):
        while True:
            held = condition()
            if held if isinstance(held, bool) else await held:
                return
            await anyio.sleep(0.02)


def ids_in_use(store: EtcdStore) -> list[int]:
    """The watch ids in use on each open stream of ``store``."""
    return [len(stream) for stream in store._watches.streams()]


async def gauges_are(member: EtcdMember, expected: tuple[int, int]) -> bool:
    return await gauges(member) == expected


async def test_many_waits_share_one_stream_and_free_their_ids(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """Thirty gets of missing keys and ten prefix waits through one store are forty watches on
    the one etcd stream it opened as it connected; once they returned, etcd holds none of them
    (their ids were cancelled), and the stream stays open for the next wait."""
    (member,) = etcd_server.members
    async with (
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as store,
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as writer,
    ):
        streams, watchers = await gauges(member)
        revision = (await store.get_prefix("p/")).revision
        values: dict[str, bytes] = {}
        changes: list[int] = []

        async def get(key: str) -> None:
            values[key] = await store.get(key, timeout=30)

        async def change(prefix: str) -> None:
            changes.append(await store.wait_for_change(prefix, after=revision, timeout=30))

        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(get, f"k/{i}")
            for i in range(10):
                tg.start_soon(change, f"p/{i}/")
            await until(lambda: ids_in_use(store) == [40])
            during = await gauges(member)
            for i in range(30):
                await writer.set(f"k/{i}", str(i))
            for i in range(10):
                await writer.set(f"p/{i}/x", b"1")
        assert during == (streams, watchers + 40)
        assert values == {f"k/{i}": str(i).encode() for i in range(30)}
        assert len(changes) == 10
        await until(lambda: ids_in_use(store) == [0])
        await until(lambda: gauges_are(member, (streams, watchers)))
        await writer.set("late", b"1")
        assert await store.get("late", timeout=10) == b"1"  # the same stream serves it
        assert await gauges(member) == (streams, watchers)


async def test_a_cancelled_wait_frees_its_watch_id(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """Waits that time out or are cancelled cancel their watches on the stream: etcd's
    watcher count returns to where it was, and the stream is still open."""
    (member,) = etcd_server.members
    async with EtcdStore(etcd_server.endpoints, prefix=etcd_prefix) as store:
        streams, watchers = await gauges(member)
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(functools.partial(store.wait, [f"never/{i}"], timeout=30))
            await until(lambda: ids_in_use(store) == [5])
            assert await gauges(member) == (streams, watchers + 5)
            tg.cancel_scope.cancel()
        with pytest.raises(TimeoutError):
            await store.get("never/again", timeout=0.2)
        await until(lambda: ids_in_use(store) == [0])
        await until(lambda: gauges_are(member, (streams, watchers)))


async def test_compacted_history_ends_only_the_wait_from_it(
    etcd_server: EtcdCluster, etcd_store: EtcdStore
) -> None:
    """Two waits on one stream: the one from a revision etcd compacted away returns early;
    the other keeps waiting on the same stream and sees the next write."""
    old = (await etcd_store.get_prefix("p/")).revision
    await etcd_store.set("other", b"1")
    now = (await etcd_store.get_prefix("q/")).revision
    with grpc.insecure_channel(etcd_server.endpoints) as channel:
        rpc.KVStub(channel).Compact(rpc.CompactionRequest(revision=now), timeout=10)
    seen: list[int] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def later() -> None:
                seen.append(await etcd_store.wait_for_change("q/", after=now))

            tg.start_soon(later)
            assert await etcd_store.wait_for_change("p/", after=old) >= now
            assert not seen
            (stream,) = etcd_store._watches.streams()
            await etcd_store.set("q/x", b"1")
    assert len(seen) == 1
    assert seen[0] > now
    assert etcd_store._watches.streams() == [stream]


@pytest.mark.parametrize("anyio_backend", [("asyncio", {})], ids=["asyncio"])
async def test_a_stream_reset_recreates_every_watch_from_its_revision(
    etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """The member holding the stream is killed while twenty waits are on it: each is created
    again on one new stream on another member, from its own revision, so writes made while
    it was down are seen too."""
    async with (
        EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix) as store,
        EtcdStore(etcd_cluster.endpoints, prefix=etcd_prefix) as writer,
    ):
        values: dict[str, bytes] = {}
        revision = (await store.get_prefix("p/")).revision
        changed: list[int] = []

        async def get(key: str) -> None:
            values[key] = await store.get(key, timeout=60)

        async def change() -> None:
            changed.append(await store.wait_for_change("p/", after=revision, timeout=60))

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(get, f"k/{i}")
                tg.start_soon(change)
                await until(lambda: ids_in_use(store) == [21])
                (old,) = store._watches.streams()
                (victim,) = [m for m in etcd_cluster.members if m.endpoint == old.member.address]
                victim.kill()
                for i in range(10):
                    await writer.set(f"k/{i}", str(i))  # while the watches are re-created
                await writer.set("p/x", b"1")
                await until(lambda: len(values) == 10 and ids_in_use(store) == [10])
                (new,) = store._watches.streams()
                for i in range(10, 20):
                    await writer.set(f"k/{i}", str(i))
        assert new.member.address != victim.endpoint
        assert values == {f"k/{i}": str(i).encode() for i in range(20)}
        assert len(changed) == 1
        assert changed[0] > revision
        assert store.statistics().watches_resumed >= 21
