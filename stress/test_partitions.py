"""Random network partitions of real agents on 4-8 hosts (network namespaces), c10d and etcd.

Each step picks a fault at random: one host cut from all, one host's outgoing packets dropped
(a one-way cut), or a random minority cut from the rest (for c10d, the store's host is among
the candidates; for etcd, members run on hosts 0-2). From the fault it derives which hosts
can still reach the store (the side with the c10d store, or with the etcd majority) and
which are cut off; it waits for every cut-off host's worker to end (fenced), for the reaching
side to re-form (when it has ``min_nodes``), heals, and waits for all hosts to be in one
world again. The workers' own records (``tests/network/_job.py``) show every moment two live
workers of different rounds held one rank; there must be none, and no wait may run out. A
wait that runs out is counted as a hang and the run goes on: ``hang-<step>.txt`` in the kept
work directory holds the live workers, the agents' consoles and their Python stacks.

With ``--recovery in-place`` (the ``in-place`` runs), the workers report each generation they
are in, and the summary also says how often the re-formed side's workers were the very
processes that ran before the fault (survivors keep their pids).

``AIOELASTIC_PARTITIONS`` (default 50 per backend) and ``AIOELASTIC_PARTITION_SEED`` choose
the run; figures (fault to fenced, fault to re-formed, heal to rejoined) go to the summary.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import pytest

from aioelastic.testing import Host, Network, unavailable_reason
from stress.conftest import Figures
from tests.network._job import Collector, Job, NotWithin
from tests.network.test_inplace_partitions import IN_PLACE_WORKER

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(3600)]

PARTITIONS = int(os.environ.get("AIOELASTIC_PARTITIONS", "50"))
SEED = int(os.environ.get("AIOELASTIC_PARTITION_SEED", "19"))
HEARTBEAT = 3.0
CONF = f"heartbeat_timeout={HEARTBEAT:g},keep_alive_interval=0.5,last_call_timeout=0.5"
HANG_BOUND = 60.0
"""A wait longer than this is a hang (fencing is due within HEARTBEAT, rejoining in seconds)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def summary(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "max": round(ordered[-1], 2),
    }


def reaching(backend: str, hosts: list[Host], side: list[Host], kind: str) -> list[Host]:
    """The hosts that still reach the store once ``side`` is cut off by ``kind``."""
    rest = [h for h in hosts if h not in side]
    if backend == "c10d":
        store = hosts[0]
        if store not in side:
            return rest
        return [store] if kind in ("cut", "one-way") else side
    members = {h for h in hosts if h.index < 3}
    return side if len(members & set(side)) >= 2 else rest


@pytest.mark.parametrize("recovery", ["restart", "in-place"])
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
async def test_random_partitions_never_split_the_brain(
    backend: str, recovery: str, figures: Figures
) -> None:
    """PARTITIONS random partitions: 0 split brains, 0 hangs; the figures of each step."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be made: {reason}")
    rng = random.Random(f"{SEED}-{backend}")
    size = rng.randint(4, 8)
    workdir = Path(tempfile.mkdtemp(prefix="aioe-stress-"))
    collector = Collector(workdir / "records.sock")
    fenced, reformed, rejoined, hangs, kinds = [], [], [], 0, []
    kept, reforms = 0, 0
    log = (workdir / "steps.log").open("w")
    try:
        async with Network(size) as net, anyio.create_task_group() as tg:
            await tg.start(collector.serve)
            job = Job(net, workdir, collector)
            try:
                hosts = net.hosts
                endpoint = await job.endpoint(backend, hosts if backend == "c10d" else hosts[:3])
                script = None
                if recovery == "in-place":
                    script = workdir / "inplace_worker.py"
                    script.write_text(IN_PLACE_WORKER)
                await job.start(
                    tg,
                    hosts,
                    backend=backend,
                    endpoint=endpoint,
                    conf=CONF,
                    nnodes=f"2:{size}",
                    options=("--recovery", recovery),
                    script=script,
                )
                await collector.wait_for(lambda: collector.world(hosts), within=120)
                for step in range(PARTITIONS):
                    kind = rng.choice(["cut", "one-way", "minority"])
                    if kind == "minority":
                        side = rng.sample(hosts, rng.randint(1, (size - 1) // 2))
                    else:
                        side = [rng.choice(hosts)]
                    reach = reaching(backend, hosts, side, kind)
                    cut_off = [h for h in hosts if h not in reach]
                    kinds.append(kind)
                    stale = [w for w in collector.live if w.host in {h.addr for h in cut_off}]
                    before = {w.pid for w in collector.live}
                    at = time.time()
                    if kind == "cut":
                        await net.cut(side[0])
                    elif kind == "one-way":
                        for other in hosts:
                            if other is not side[0]:
                                await net.cut_one_way(side[0], other)
                    else:
                        await net.partition(side)
                    try:
                        await collector.wait_for(
                            lambda stale=stale: all(w.ended is not None for w in stale),
                            within=HANG_BOUND,
                        )
                        fenced += [w.ended - at for w in stale if w.ended is not None]
                        if len(reach) >= 2:
                            world = await collector.wait_for(
                                lambda reach=reach: collector.world(reach), within=HANG_BOUND
                            )
                            reformed.append(min(w.started for w in world) - at)
                            reforms += 1
                            if {w.pid for w in world} <= before:
                                kept += 1
                            elif recovery == "in-place":  # keep what the agents said, to see why
                                (workdir / f"restarted-{step}.txt").write_text(job.consoles())
                        healed = time.time()
                        await net.heal()
                        world = await collector.wait_for(
                            lambda: collector.world(hosts), within=HANG_BOUND
                        )
                        rejoined.append(min(w.started for w in world) - healed)
                    except NotWithin as hang:
                        hangs += 1
                        what = f"{kind} of {[h.addr for h in side]}: {str(hang).splitlines()[0]}"
                        report = await job.hang_report()
                        (workdir / f"hang-{step}.txt").write_text(f"step {step}: {what}\n{report}")
                        await net.heal()
                        await collector.wait_for(lambda: collector.world(hosts), within=120)
                    print(
                        f"step {step}: {kind} of {[h.addr for h in side]}, cut off "
                        f"{[h.addr for h in cut_off]}; split brains so far "
                        f"{len(collector.split_brains)}",
                        file=log,
                        flush=True,
                    )
            finally:  # a failed wait leaves no agent behind for the next test
                with anyio.CancelScope(shield=True):
                    await job.stop()
                tg.cancel_scope.cancel()
    finally:
        log.close()
    figures["hosts"] = size
    figures["partitions"] = PARTITIONS
    figures["kinds"] = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
    figures["split_brains"] = len(collector.split_brains)
    figures["hangs"] = hangs
    figures["fault_to_fenced_s"] = summary(fenced)
    figures["fault_to_reformed_s"] = summary(reformed)
    figures["heal_to_rejoined_s"] = summary(rejoined)
    figures["recovery"] = recovery
    figures["reformed_by_the_same_processes"] = f"{kept} of {reforms}"
    figures["workdir"] = str(workdir)
    assert collector.split_brains == []
    assert hangs == 0, f"hangs: see {workdir}/hang-*.txt"
    if kept == reforms:
        shutil.rmtree(workdir, ignore_errors=True)
