"""In-place recovery through another host's partition: the survivors keep their processes.

Three hosts (network namespaces), an ``aioelastic run --recovery in-place`` agent on each over
c10d (the store on host 0) or etcd (a member on each), one worker per host that reports each
world it enters to the test's collector (``_job.py``) as its *round* (the generation), rank and
world size, and holds the report open while it is in that world: the records show which
worlds are live at every instant, so two live worlds sharing a rank would be seen.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from aioelastic.testing import Network
from aioelastic.worker._abort import ABORT_SWITCH_ENV
from tests.network._job import Collector, Job
from tests.network.test_partitions import CONF, HEARTBEAT, SLACK

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

IN_PLACE_WORKER = """
import json, os, socket, time
from aioelastic import worker
for world in worker.worlds():
    with world:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(os.environ["COLLECTOR"])
        record = {"host_addr": os.environ["HOST_ADDR"], "aioelastic_round": world.generation,
                  "rank": world.rank, "world_size": world.world_size, "group_rank": "",
                  "pid": os.getpid(), "started": time.time()}
        sock.sendall(json.dumps(record).encode() + b"\\n")
        try:
            while True:
                world.check()
                time.sleep(0.05)  # a step of an idle worker  # pace
        finally:
            sock.close()
"""
"""A worker that reports each world it is in, for as long as it is in it."""


LEADER_PROBE = """
import json, sys, urllib.request
for index, addr in enumerate(sys.argv[1:]):
    request = urllib.request.Request(f"http://{addr}:2379/v3/maintenance/status", data=b"{}")
    status = json.load(urllib.request.urlopen(request, timeout=5))
    if status["leader"] == status["header"]["member_id"]:
        print(index)
"""
"""Prints the index of the etcd member that is the leader (through etcd's JSON gateway)."""


async def etcd_leader(net: Network) -> int | None:
    """The host whose etcd member leads the cluster now (None: no member says it leads)."""
    hosts = net.hosts
    done = await hosts[0].run([sys.executable, "-c", LEADER_PROBE, *(h.addr for h in hosts)])
    leaders = done.stdout.split()
    return int(leaders[0]) if leaders else None


@asynccontextmanager
async def in_place_job(script: str, backend: str, nnodes: str) -> AsyncIterator[Job]:
    """Three hosts, a collector (in a short directory: UNIX socket paths are short) and an
    in-place job of ``script``, one worker a host, over c10d (the store on host 0) or a
    3-member etcd (a member per host); stopped and removed on the way out."""
    workdir = Path(tempfile.mkdtemp(prefix="aioe-"))
    collector = Collector(workdir / "records.sock")
    try:
        async with Network(3) as net, anyio.create_task_group() as tg:
            await tg.start(collector.serve)
            job = Job(net, workdir, collector)
            path = workdir / "worker.py"
            path.write_text(script)
            await job.start(
                tg,
                net.hosts,
                backend=backend,
                endpoint=await job.endpoint(backend, net.hosts),
                conf=CONF,
                nnodes=nnodes,
                options=("--recovery", "in-place"),
                script=path,
            )
            try:
                yield job
            finally:
                await job.stop()
                tg.cancel_scope.cancel()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=["c10d", "etcd"])
async def job(request: pytest.FixtureRequest) -> AsyncIterator[Job]:
    """An in-place job of :data:`IN_PLACE_WORKER` over c10d or etcd, 2 to 3 nodes."""
    async with in_place_job(IN_PLACE_WORKER, request.param, "2:3") as job:
        yield job


async def test_survivors_keep_their_processes_through_another_hosts_partition(job: Job) -> None:
    """A host cut off (not c10d's store host, nor etcd's leader): it fences its worker; the
    others go on in a world of 2 with the same worker processes; after the heal the cut host is
    taken back in, again without a restart of the survivors, and no two live worlds ever shared
    a rank.

    Not etcd's leader: cutting off the leader's host leaves the others' members without a
    leader until they elect one (``--election-timeout 1000``: 1-2 s, longer after a split
    vote), and a store that acknowledges no liveness renewal for 2.5 s makes the survivors
    fence themselves, as they must (``heartbeat_timeout=3``): the cause of this test's
    failures in about 1 run in 8 while it cut host 2 whatever its member was."""
    net, records = job.net, job.collector
    await records.wait_for(lambda: records.world(net.hosts))
    a, b, c = net.hosts
    if job.etcd and await etcd_leader(net) == c.index:
        a, b, c = a, c, b
    first = {w.host: w for w in records.live}
    cut_at = time.time()
    await net.cut(c)
    fenced_at = await job.wait_said(c, "fenced:", after=cut_at)
    smaller = await records.wait_for(lambda: records.world([a, b]))
    await net.heal()
    larger = await records.wait_for(lambda: records.world(net.hosts))
    assert records.split_brains == [], job.consoles()
    survivors = {first[h.addr].pid for h in (a, b)}
    assert {w.pid for w in smaller} == survivors, job.consoles()
    assert survivors < {w.pid for w in larger}, job.consoles()
    assert first[c.addr].pid not in {w.pid for w in larger}  # fenced: killed, a new one joined
    assert fenced_at - cut_at <= HEARTBEAT + SLACK
    stale = first[c.addr]
    assert stale.ended is not None
    assert stale.ended <= min(w.started for w in smaller)
    for host in (a, b):
        assert "restarting" not in job.agent(host).console


GLOO_WORKER = """
import json, os, socket, time
import torch
import torch.distributed as dist
from aioelastic import worker
step = 0
for world in worker.worlds():
    with world:
        world.init_process_group("gloo")
        if world.fresh_ranks:
            box = torch.tensor([step], dtype=torch.int64)
            dist.broadcast(box, src=world.source_rank)
            step = int(box.item())
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(os.environ["COLLECTOR"])
        record = {"host_addr": os.environ["HOST_ADDR"], "aioelastic_round": world.generation,
                  "rank": world.rank, "world_size": world.world_size, "group_rank": "",
                  "pid": os.getpid(), "started": time.time()}
        sock.sendall(json.dumps(record).encode() + b"\\n")
        try:
            while True:
                world.check()
                total = torch.tensor([float(os.getpid())], dtype=torch.float64)
                try:
                    dist.all_reduce(total)
                except RuntimeError as exc:
                    print(f"gen {world.generation} pid {os.getpid()} left on: {exc}", flush=True)
                    raise
                print(f"gen {world.generation} step {step} sum {int(total.item())}", flush=True)
                sock.sendall(b"beat\\n")
                step += 1
                time.sleep(0.05)  # a step of an idle worker  # pace
        finally:
            sock.close()
"""
"""A gloo worker: all_reduces its pid each step (the sum proves who was in the world) and
reports each world it is in to the collector, with a beat per step."""


@pytest.fixture(params=["abort", "no-abort"])
async def gloo_job(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Job, bool]]:
    """Three hosts, an in-place c10d job (the store on host 0) of gloo workers, one a host;
    with the workers' abort, or with it turned off (``AIOELASTIC_WORKER_ABORT=0``)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    abort = request.param == "abort"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")  # the hosts share a host name: use eth0
    if not abort:
        monkeypatch.setenv(ABORT_SWITCH_ENV, "0")
    async with in_place_job(GLOO_WORKER, "c10d", "2:3") as job:
        yield job, abort


def sums(console: str) -> list[tuple[int, int]]:
    """(generation, sum) of every step a host's workers printed."""
    return [(int(g), int(t)) for g, t in re.findall(r"gen (\d+) step \d+ sum (\d+)", console)]


@pytest.mark.torch
async def test_gloo_survivors_leave_a_collective_with_a_partitioned_peer(
    gloo_job: tuple[Job, bool],
) -> None:
    """Host 2 is cut off while every rank all_reduces with it (its worker never answers, nothing
    is reset). With the workers' abort, the survivors' agents make them leave the collective
    (gloo: their connections shut down) and they train on in a world of 2 in the same
    processes. With the abort turned off, a survivor answers "unavailable" and its agent
    restarts it, saying why (the other survivor may be restarted too, or leave when that one's
    death breaks its collective). Either way nobody waits out gloo's own timeout (30 s)."""
    job, abort = gloo_job
    net, records = job.net, job.collector
    a, b, c = net.hosts
    first = await records.wait_for(lambda: records.world(net.hosts))
    await records.wait_for(lambda: all(w.beats >= 3 for w in first))
    await net.cut(c)
    smaller = await records.wait_for(lambda: records.world([a, b]))
    await records.wait_for(lambda: all(w.beats >= 3 for w in smaller))
    survivors = {w.host: w.pid for w in first if w.host != c.addr}
    generation = smaller[0].round
    restarted = []
    for host in (a, b):
        console, pid = job.agent(host).console, survivors[host.addr]
        assert (generation, sum(w.pid for w in smaller)) in sums(console), job.consoles()
        assert "Timed out" not in console, job.consoles()
        assert "restarting the worker group" not in console
        if abort:
            assert "collectives aborted (gloo: shut down" in console, job.consoles()
            assert f"pid {pid} left on:" in console
            assert "Connection closed by peer" in console
            assert "restarting rank" not in console
            continue
        assert "collectives unavailable (turned off" in console, job.consoles()
        found = re.search(rf"restarting rank \d \(pid {pid}\) to leave generation 1: (.*)", console)
        if found is not None:
            assert found.group(1).startswith("abort unavailable (")
            restarted.append(pid)
        else:  # it left when the restarted survivor's death broke its collective
            assert f"pid {pid} left on:" in console, job.consoles()
    in_smaller = {w.pid for w in smaller}
    if abort:
        assert in_smaller == set(survivors.values()), job.consoles()
    else:
        assert restarted, job.consoles()
        assert in_smaller.isdisjoint(restarted)
        assert in_smaller - set(survivors.values()), job.consoles()


WITHIN = 45
"""Each wait of the re-rendezvous test: well inside pytest-timeout's 120 s, so a failure is a
clean one (an alarm that interrupts the event loop can leave the namespaces' teardown hung)."""


async def test_a_survivor_cut_off_while_it_re_rendezvouses_fences_its_workers() -> None:
    """Three hosts, exactly three nodes wanted (``--nnodes 3``): host 1's agent is killed, so
    hosts 0 and 2 re-rendezvous with their workers running and wait there for a third node.
    Host 2 is then cut off: no liveness renewal is acknowledged, so it fences its worker while
    still joining (its ranks may be taken by others), instead of running on as a rank of a
    world nobody else is in."""
    async with in_place_job(IN_PLACE_WORKER, "c10d", "3") as job:
        await check_fenced_while_joining(job)


async def check_fenced_while_joining(job: Job) -> None:
    net, records = job.net, job.collector
    a, b, c = net.hosts
    first = await records.wait_for(lambda: records.world(net.hosts), within=WITHIN)
    killed_at = time.time()
    job.agent(b).process.kill()
    await job.wait_said(c, "joining rendezvous", after=killed_at, within=WITHIN)
    await records.wait_for(lambda: records.world([a, c]), within=WITHIN)  # goes on meanwhile
    cut_at = time.time()
    await net.cut(c)
    fenced_at = await job.wait_said(c, "fenced while re-rendezvousing", after=cut_at, within=WITHIN)
    worker = next(w for w in records.workers if w.host == c.addr and w.round > first[0].round)
    await records.wait_for(lambda: worker.ended is not None, within=WITHIN)
    assert fenced_at - cut_at <= HEARTBEAT + SLACK, job.consoles()
    assert "killing the workers (SIGKILL)" in job.agent(c).console
