"""Stress: an EtcdStore keeps its guarantees while every member of a 3-member etcd cluster is
killed and restarted in turn, several times (about a minute; run with ``make stress``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.store import EtcdStore
from aioelastic.testing import EtcdCluster
from tests.etcd_fixtures import etcd_binary, start_cluster

__all__ = ["etcd_binary"]  # the fixture, imported for pytest

CYCLES = 3
ADDERS = 6


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


@pytest.fixture
def cluster(etcd_binary: str, tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = start_cluster(etcd_binary, tmp_path / "etcd", 3)
    yield cluster
    cluster.stop(timeout=1)


@pytest.mark.anyio
@pytest.mark.timeout(600)
async def test_rolling_member_kills_lose_and_duplicate_nothing(cluster: EtcdCluster) -> None:
    """Counters stay exactly-once and a watcher sees every key through rolling member kills."""
    totals: list[int] = []
    written: list[str] = []
    seen: dict[str, bytes] = {}
    stop, adders_done = anyio.Event(), anyio.Event()
    wakeups = 0
    async with (
        EtcdStore(cluster.endpoints, prefix="/stress/") as store,
        EtcdStore(cluster.endpoints, prefix="/stress/") as watcher,
    ):

        async def add_until_stopped(i: int) -> None:
            n = 0
            while not stop.is_set():
                totals.append(await store.add("counter", 1))
                await store.set(f"k/{i}/{n}", b"x")
                written.append(f"k/{i}/{n}")
                n += 1

        async def watch() -> None:
            nonlocal wakeups
            revision = 0
            while True:
                snapshot = await watcher.get_prefix("k/")
                seen.update(snapshot.items)
                if adders_done.is_set() and "k/done" in snapshot.items:
                    return
                revision = snapshot.revision
                await watcher.wait_for_change("k/", after=revision, timeout=60)
                wakeups += 1

        with anyio.fail_after(500):
            async with anyio.create_task_group() as outer:
                outer.start_soon(watch)
                async with anyio.create_task_group() as tg:
                    for i in range(ADDERS):
                        tg.start_soon(add_until_stopped, i)
                    for _ in range(CYCLES):
                        for member in cluster.members:
                            await anyio.to_thread.run_sync(member.kill)
                            member.start()
                            await anyio.to_thread.run_sync(cluster.wait_ready, [member])
                    stop.set()
                adders_done.set()
                await store.set("k/done", b"")  # after every other write: the watcher's last
        assert sorted(totals) == list(range(1, len(totals) + 1))
        assert await store.get("counter") == str(len(totals)).encode()
        assert set(written) <= set(seen)
        assert wakeups > CYCLES * len(cluster.members)
        assert store.statistics().failovers > 0
