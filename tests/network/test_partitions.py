"""Real partitions between hosts: the cut-off node fences its workers, the others re-form, and
everyone is back in one world after the heal; never two live worlds sharing a rank.

Each test runs three hosts (network namespaces), an ``aioelastic run`` agent on each with a
plain-Python worker, over c10d (store on host 0) or over a 3-member etcd (one member per
host). The workers' own records (see ``_job.py``) are the evidence.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from aioelastic.testing import Host, Network
from tests.network._job import Collector, Job

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

HEARTBEAT = 3.0
CONF = f"heartbeat_timeout={HEARTBEAT:g},keep_alive_interval=0.5,last_call_timeout=0.5"
SLACK = 5.0
"""Generous: real processes on a loaded machine; fencing is due a margin *before* HEARTBEAT."""


@dataclass
class Cluster:
    net: Network
    job: Job
    collector: Collector
    tg: anyio.abc.TaskGroup


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """Three hosts and a collector (in a short directory: UNIX socket paths are short)."""
    workdir = Path(tempfile.mkdtemp(prefix="aioe-"))
    collector = Collector(workdir / "records.sock")
    try:
        async with Network(3) as net, anyio.create_task_group() as tg:
            await tg.start(collector.serve)
            job = Job(net, workdir, collector)
            yield Cluster(net, job, collector, tg)
            await job.stop()
            tg.cancel_scope.cancel()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def start(cluster: Cluster, backend: str, *, beat: float = 0.0) -> None:
    hosts = cluster.net.hosts
    endpoint = await cluster.job.endpoint(backend, hosts)
    await cluster.job.start(
        cluster.tg, hosts, backend=backend, endpoint=endpoint, conf=CONF, nnodes="2:3", beat=beat
    )
    await cluster.collector.wait_for(lambda: cluster.collector.world(hosts))


Fault = Callable[[Network], Awaitable[Host]]
"""Cuts one host off (its way) and returns it."""


async def cut_last(net: Network) -> Host:
    await net.cut(net.hosts[2])
    return net.hosts[2]


async def cut_last_one_way(net: Network) -> Host:
    for other in net.hosts[:2]:
        await net.cut_one_way(net.hosts[2], other)
    return net.hosts[2]


async def lose_replies_to_last(net: Network) -> Host:
    """The store's (or the etcd members') packets to host 2 are dropped; its own go through."""
    for other in net.hosts[:2]:
        await net.cut_one_way(other, net.hosts[2])
    return net.hosts[2]


async def minority(net: Network) -> Host:
    await net.partition([net.hosts[2]])
    return net.hosts[2]


async def cut_leader(net: Network) -> Host:
    """Cut off the host of the etcd leader (each host runs one member)."""
    endpoints = ",".join(f"http://{host.addr}:2379" for host in net.hosts)
    status = await net.hosts[0].run(
        ["etcdctl", "--endpoints", endpoints, "endpoint", "status", "-w", "json"]
    )
    for member in json.loads(status.stdout):
        header = member["Status"]["header"]
        if member["Status"]["leader"] == header["member_id"]:
            leader = next(h for h in net.hosts if f"//{h.addr}:" in member["Endpoint"])
            await net.partition([leader])
            return leader
    raise AssertionError(f"no etcd member reports itself leader: {status.stdout!r}")


@pytest.mark.parametrize(
    ("backend", "fault"),
    [
        ("c10d", cut_last),
        ("c10d", cut_last_one_way),
        ("c10d", lose_replies_to_last),
        ("etcd", minority),
        ("etcd", cut_last_one_way),
        ("etcd", lose_replies_to_last),
        ("etcd", cut_leader),
    ],
    ids=[
        "c10d-host-cut",
        "c10d-one-way",
        "c10d-replies-lost",
        "etcd-minority",
        "etcd-one-way",
        "etcd-replies-lost",
        "etcd-leader-cut",
    ],
)
async def test_the_cut_off_node_fences_the_others_reform_and_it_rejoins(
    cluster: Cluster, backend: str, fault: Fault
) -> None:
    """One host loses the others: its worker is killed (fenced) before the survivors' new
    world starts, the survivors re-form a world of 2, and after the heal all three form one
    world."""
    net, job, records = cluster.net, cluster.job, cluster.collector
    await start(cluster, backend)
    first = {w.host: w for w in records.live}
    cut_at = time.time()
    c = await fault(net)
    fenced_at = await job.wait_said(c, "fenced:", after=cut_at)
    survivors = await records.wait_for(
        lambda: records.world([host for host in net.hosts if host is not c])
    )
    healed_at = time.time()
    await net.heal()
    await records.wait_for(lambda: records.world(net.hosts))
    assert records.split_brains == [], job.consoles()
    stale = first[c.addr]
    assert stale.ended is not None
    assert stale.ended <= min(w.started for w in survivors)
    assert fenced_at - cut_at <= HEARTBEAT + SLACK
    assert healed_at > fenced_at


async def test_over_c10d_cutting_the_store_host_fences_every_other_node(cluster: Cluster) -> None:
    """With the c10d store's host cut off, every other node fences (none can reach the store,
    so no world forms without it); after the heal all three form one world."""
    net, job, records = cluster.net, cluster.job, cluster.collector
    await start(cluster, "c10d")
    store_host, b, c = net.hosts
    cut_at = time.time()
    await net.cut(store_host)
    for host in (b, c):
        await job.wait_said(host, "fenced:", after=cut_at)
    await records.wait_for(lambda: not [w for w in records.live if w.host != store_host.addr])
    await net.heal()
    await records.wait_for(lambda: records.world(net.hosts))
    assert records.split_brains == [], job.consoles()


async def slow_lossy(net: Network, host: Host) -> None:
    await net.delay(host, 100)
    await net.lose(host, 2)


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
async def test_a_slow_lossy_link_does_not_fence(cluster: Cluster, backend: str) -> None:
    """100 ms of latency and 2 % loss on host 2's link, for two heartbeat timeouts by its
    worker's own beats: nobody is fenced and the same workers keep running."""
    net, job, records = cluster.net, cluster.job, cluster.collector
    await start(cluster, backend, beat=0.1)
    before = sorted((w.host, w.pid) for w in records.live)
    c = net.hosts[2]
    worker = next(w for w in records.live if w.host == c.addr)
    await slow_lossy(net, c)
    beats = worker.beats
    await records.wait_for(lambda: worker.beats >= beats + 2 * HEARTBEAT / 0.1)
    assert sorted((w.host, w.pid) for w in records.live) == before
    assert all(agent.said("fenced:") is None for agent in job.agents), job.consoles()
