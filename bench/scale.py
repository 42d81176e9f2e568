"""Scale envelope: rendezvous formation and recovery against job size, with the store work behind.

For N simulated nodes, each an elastic rendezvous handler in its own task of this process:

* **formation**: from "go" to the last node's ``next_rendezvous()`` returning (one round of N);
* **loss -> next round**: a node is cut off (its store fails, so it says no goodbye) and its
  liveness key is deleted, the event its heartbeat's expiry produces; from that delete to the
  last survivor's next ``next_rendezvous()`` returning. The survivors' round is sealed by the
  last call (min_nodes = N - 1), whose configured wait is subtracted: what is left is
  detection, invalidation, rejoining and sealing;
* **loss -> new generation** (in-place recovery, issue 16): the generation protocol's pure
  core (``aioelastic.agent._generations``) with one worker per node and a spare on the failed
  node, from the failed worker's exit to ``GenerationFormed``, every worker answering at once:
  the core's CPU, not processes (``bench.recovery`` times real gloo jobs);
* store operations and value bytes (written + read) per node, by operation;
* the store server's CPU during each phase (``/proc/<pid>/stat`` of the TCP store server or
  etcd process); over the memory store the whole process's CPU and the share of it the cyclic
  garbage collector took (one process holding every node's objects is the simulation's cost,
  not the protocol's).

Backends: the memory store (ours, in this process), the TCP store over real connections (one
connection per node to a ``aioelastic store-server`` process; the fd limit is raised to the
hard limit), and a real single-member etcd: ``etcd`` gives each node its own ``EtcdStore`` (its
own gRPC channel, session lease and watches: N real sessions), ``etcd-shared`` one client
shared by every node (as ``bench.rendezvous_etcd``'s 1,000 handlers).
The machine is shared (2 cores, other jobs running): wall times are noisy, operation counts
are not. Run ``python -m bench.scale`` (``--quick``: the small sizes only).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import itertools
import json
import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio

from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._layout import alive_key
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import MemoryStore, Snapshot, Store, TCPStore, Value
from aioelastic.testing import FaultyStore

SIZES = {
    "memory": (100, 1000, 4000, 10000, 32000),
    "tcp": (100, 1000, 4000, 10000),
    "etcd": (100, 1000),
    "etcd-shared": (100, 1000),
}
HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
QUICK = {"memory": (100, 1000), "tcp": (100, 1000), "etcd": (100,), "etcd-shared": (100,)}
TARGETS = {("memory", 10000): 5.0, ("memory", 32000): 20.0, ("tcp", 1000): 1.5}  # issue 18
LAST_CALL = 1.0  # seconds; subtracted from loss -> next round
CHART = Path(__file__).resolve().parent / "scale.png"
T = TypeVar("T")


class MeteredStore(Store):
    """Forwards to ``store``, counting operations (by name) and the value bytes written and read.

    A call whose result the meter does not read is handed on as the inner store's own
    coroutine, so the meter adds no coroutine to it: in one process holding every node, each
    coroutine alive across a call is one more object for the collector to walk (the meter was
    two levels deep before: 8-9 of a formation's ~200 objects a node, and their CPU).
    """

    def __init__(self, store: Store, counts: Counter[str]) -> None:
        self.store = store
        self.timeout = store.timeout
        self.counts = counts

    @property
    def endpoint(self) -> str:
        return self.store.endpoint

    def _count(self, name: str, call: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        self.counts[name] += 1
        return call

    def set(self, key: str, value: Value, *, ttl: float | None = None) -> Coroutine[Any, Any, None]:
        self.counts["bytes"] += len(value)
        return self._count("set", self.store.set(key, value, ttl=ttl))

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        value = await self._count("get", self.store.get(key, timeout=timeout))
        self.counts["bytes"] += len(value)
        return value

    def add(self, key: str, amount: int) -> Coroutine[Any, Any, int]:
        return self._count("add", self.store.add(key, amount))

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        self.counts["bytes"] += len(expected) + len(desired)
        stored = await self._count("compare_set", self.store.compare_set(key, expected, desired))
        self.counts["bytes"] += len(stored)
        return stored

    @property
    def counts_keys(self) -> bool:
        return self.store.counts_keys

    def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> Coroutine[Any, Any, int]:
        self.counts["bytes"] += sum(len(value) for value in values)
        return self._count(
            "multi_set_and_count", self.store.multi_set_and_count(keys, values, prefix=prefix)
        )

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        self.counts["bytes"] += sum(len(value) for value in values)
        count, snapshot = await self._count(
            "multi_set_count_and_read",
            self.store.multi_set_count_and_read(keys, values, prefix=prefix, read=read),
        )
        self.counts["bytes"] += sum(len(value) for value in snapshot.items.values())
        return count, snapshot

    def wait(
        self, keys: Sequence[str], *, timeout: float | None = None
    ) -> Coroutine[Any, Any, None]:
        return self._count("wait", self.store.wait(keys, timeout=timeout))

    def check(self, keys: Sequence[str]) -> Coroutine[Any, Any, bool]:
        return self._count("check", self.store.check(keys))

    def delete_key(self, key: str) -> Coroutine[Any, Any, bool]:
        return self._count("delete_key", self.store.delete_key(key))

    def num_keys(self) -> Coroutine[Any, Any, int]:
        return self._count("num_keys", self.store.num_keys())

    def multi_get(
        self, keys: Sequence[str], *, timeout: float | None = None
    ) -> Coroutine[Any, Any, list[bytes]]:
        return self._count("multi_get", self.store.multi_get(keys, timeout=timeout))

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> Coroutine[Any, Any, None]:
        return self._count("multi_set", self.store.multi_set(keys, values))

    def append(self, key: str, value: Value) -> Coroutine[Any, Any, None]:
        return self._count("append", self.store.append(key, value))

    async def get_prefix(self, prefix: str) -> Snapshot:
        snapshot = await self._count("get_prefix", self.store.get_prefix(prefix))
        self.counts["bytes"] += sum(len(value) for value in snapshot.items.values())
        return snapshot

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        snapshots = await self._count("get_prefixes", self.store.get_prefixes(prefixes))
        self.counts["bytes"] += sum(
            len(value) for snapshot in snapshots for value in snapshot.items.values()
        )
        return snapshots

    def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> Coroutine[Any, Any, int]:
        return self._count(
            "wait_for_change", self.store.wait_for_change(prefix, after=after, timeout=timeout)
        )

    def ttl_remaining(self, key: str) -> Coroutine[Any, Any, float | None]:
        return self.store.ttl_remaining(key)


@dataclass
class Phase:
    """One measured phase of a point."""

    seconds: float = math.nan
    cpu: float = math.nan
    """This process's CPU seconds (every node, and the memory store)."""
    server: float = math.nan
    """The store server's CPU seconds (TCP store server or etcd process; nan: in-process)."""
    gc: float = math.nan
    """CPU seconds of the cyclic garbage collector in this process during the phase."""
    full_gc: int = 0
    """Full collections during the phase (each walks every node's objects)."""
    ops: dict[str, int] = field(default_factory=dict)


@dataclass
class Point:
    backend: str
    nodes: int
    formation: Phase
    loss: Phase
    generation: float = math.nan  # issue 16: time from failure to a new generation
    objects: float = math.nan
    """GC-tracked objects of this process per node once the round formed (no collection
    first: the figure includes what is garbage by then, which is little)."""
    tasks: float = math.nan
    """Tasks of this process per node once the round formed (asyncio)."""


class GCMeter:
    """CPU time spent in the cyclic garbage collector while ``on``."""

    def __init__(self) -> None:
        self.total = 0.0
        self.full = 0
        """Full (oldest-generation) collections so far: each walks every tracked object."""
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.total += time.process_time() - self._start
            self.full += info["generation"] == 2


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the simulation, over any store ---------------------------------------------------------------


async def simulate(
    backend: str,
    nodes: int,
    open_view: Callable[[int], AsyncIterator[Store]],
    admin: Store,
    server_cpu: Callable[[], float],
) -> Point:
    """One round of ``nodes``, then one loss and the survivors' round (see the module doc)."""
    gc.collect()  # the previous point's garbage is not this point's cost
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    settings = ElasticSettings(
        run_id,
        nodes - 1,
        nodes,
        join_timeout=600,
        last_call_timeout=LAST_CALL,
        keep_alive_interval=300,  # no keep-alive traffic inside the measured windows
        heartbeat_timeout=900,
        read_timeout=600,
    )
    counts: Counter[str] = Counter()
    meter = GCMeter()
    entered, go = anyio.Event(), anyio.Event()
    joined = [anyio.Event(), anyio.Event()]
    rounds: Counter[int] = Counter()
    victim = nodes - 1  # the only node seen through a FaultyStore, so it can be cut off
    victim_store: FaultyStore | None = None
    victim_scope = anyio.CancelScope()
    victim_id = -1
    ready = 0

    async def node(index: int) -> None:
        nonlocal ready, victim_store, victim_id
        async with AsyncExitStack() as stack:
            view: Store = MeteredStore(
                await stack.enter_async_context(asynccontextmanager(open_view)(index)), counts
            )
            if index == victim:
                view = victim_store = FaultyStore(view, name=f"node{index}")
            handler = await stack.enter_async_context(
                ElasticRendezvousHandler(view, settings, backend=backend, local_addr="127.0.0.1")
            )
            if index == victim:
                victim_id = handler.node_id
            ready += 1
            if ready == nodes:
                entered.set()
            await go.wait()
            for round_ in (0, 1):
                await handler.next_rendezvous()
                rounds[round_] += 1
                if rounds[round_] == (nodes if round_ == 0 else nodes - 1):
                    joined[round_].set()
                await handler.wait_round_invalidated()
            await anyio.sleep_forever()

    async def victim_node() -> None:
        with victim_scope:
            await node(victim)

    async with anyio.create_task_group() as tg:
        for index in range(nodes - 1):
            tg.start_soon(node, index)
        tg.start_soon(victim_node)
        await entered.wait()
        formation, loss = Phase(), Phase()
        objects = tasks = 0
        for phase in (formation, loss):
            counts.clear()
            gc_before, cpu_before, server_before = meter.total, time.process_time(), server_cpu()
            full_before = meter.full
            if phase is formation:
                started = time.perf_counter()
                go.set()
                await joined[0].wait()
                phase.seconds = time.perf_counter() - started
            else:
                assert victim_store is not None
                victim_store.partition()  # a crash: its goodbye fails, its key stays
                victim_scope.cancel()
                await anyio.wait_all_tasks_blocked()
                counts.clear()
                started = time.perf_counter()
                await admin.delete_key(f"rdzv/{run_id}/{alive_key(victim_id)}")
                await joined[1].wait()
                phase.seconds = time.perf_counter() - started - LAST_CALL
            phase.cpu = time.process_time() - cpu_before
            phase.server = server_cpu() - server_before
            phase.gc = meter.total - gc_before
            phase.full_gc = meter.full - full_before
            phase.ops = dict(counts)
            if phase is formation:  # outside both measured windows
                objects, tasks = len(gc.get_objects()), len(asyncio.all_tasks())
        tg.cancel_scope.cancel()
    gc.callbacks.remove(meter._callback)
    return Point(backend, nodes, formation, loss, objects=objects / nodes, tasks=tasks / nodes)


def generation_seconds(nodes: int) -> float:
    """CPU seconds of the generation core from a worker's failure to the next formed world."""
    from aioelastic.agent import _generations as g

    specs = {node: g.NodeSpec(1, 1 if node == nodes - 1 else 0) for node in range(nodes)}
    machine = g.GenerationMachine(specs, recovery_timeout=600)

    def answer(commands: list[g.Command], now: float) -> bool:
        """Let every spawned worker say Ready and every assigned one Entered; formed?"""
        pending, formed = list(commands), False
        while pending:
            command = pending.pop()
            if isinstance(command, g.Spawn):
                pending += machine.send(g.Ready(command.worker), now)
            elif isinstance(command, g.Assign):
                event = g.Entered(command.worker, command.place.generation)
                pending += machine.send(event, now)
            formed = formed or isinstance(command, g.GenerationFormed)
        return formed

    answer(machine.start(0.0), 0.0)
    assert machine.generation is not None
    assert machine.phase is g.Phase.RUNNING
    started = time.process_time()
    formed = answer(machine.send(g.Exited(machine.generation.members[-1], -9), 1.0), 1.0)
    if not formed:
        raise RuntimeError(f"no new generation formed at N={nodes} ({machine.phase})")
    return time.process_time() - started


# -- backends -------------------------------------------------------------------------------


def memory_point(nodes: int) -> Point:
    async def run() -> Point:
        store = MemoryStore()

        async def view(_: int) -> AsyncIterator[Store]:
            yield store

        return await simulate("memory", nodes, view, store, lambda: math.nan)

    return anyio.run(run)


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to the hard limit; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def tcp_point(nodes: int) -> Point:
    with subprocess.Popen(
        [sys.executable, "-m", "aioelastic", "store-server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    ) as server:  # leaving it closes the pipe
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline().rsplit(":", 1)[1])

            async def run() -> Point:
                async with TCPStore("127.0.0.1", port) as admin:

                    async def view(_: int) -> AsyncIterator[Store]:
                        async with TCPStore("127.0.0.1", port, connect_timeout=120) as store:
                            yield store

                    return await simulate("tcp", nodes, view, admin, lambda: proc_cpu(server.pid))

            # The nodes' clients on uvloop when installed, as each agent's (``aioelastic run``).
            return anyio.run(run, backend_options={"use_uvloop": HAVE_UVLOOP})
        finally:
            server.terminate()
            server.wait(timeout=30)


def etcd_point(nodes: int, endpoint: str, pid: int, *, shared: bool) -> Point:
    """A point over etcd: every node with a client of its own, or all sharing one."""
    from aioelastic.store import EtcdStore

    prefix = f"/scale-{uuid.uuid4().hex[:6]}/"

    async def run() -> Point:
        async with EtcdStore(endpoint, prefix=prefix) as admin:

            async def view(_: int) -> AsyncIterator[Store]:
                if shared:
                    yield admin
                    return
                async with EtcdStore(endpoint, prefix=prefix) as store:
                    yield store

            backend = "etcd-shared" if shared else "etcd"
            return await simulate(backend, nodes, view, admin, lambda: proc_cpu(pid))

    return anyio.run(run)


# -- report ---------------------------------------------------------------------------------


def per_node(phase: Phase, nodes: int, what: str = "ops") -> float:
    if what == "bytes":
        return phase.ops.get("bytes", 0) / nodes
    return sum(count for name, count in phase.ops.items() if name != "bytes") / nodes


def fmt_s(seconds: float) -> str:
    return "n/a" if not math.isfinite(seconds) else f"{seconds:.3f}"


def print_points(points: Sequence[Point]) -> None:
    print(f"{'measure':<44}{'aioelastic':>12}{'target':>10}{'target/ours':>13}")
    for p in points:
        target = TARGETS.get((p.backend, p.nodes))
        ratio = f"{target / p.formation.seconds:.1f}x" if target else "-"
        shown = f"{target:g}" if target else "-"
        label = f"formation, {p.backend}, N={p.nodes}"
        print(f"{label:<44}{p.formation.seconds:>12.3f}{shown:>10}{ratio:>13}  s")
        if p.backend == "memory":  # one busy thread: its CPU is its wall time on an idle machine
            ratio = f"{target / p.formation.cpu:.1f}x" if target else "-"
            label = f"formation CPU, {p.backend}, N={p.nodes}"
            print(f"{label:<44}{p.formation.cpu:>12.3f}{shown:>10}{ratio:>13}  s")
    print()
    head = (
        f"{'backend':<8}{'N':>7}  {'formation':>10}{'cpu':>9}{'gc':>9}{'server':>9}"
        f"  {'loss->round':>11}{'cpu':>9}{'gc':>9}{'server':>9}  {'loss->gen':>9}"
        f"{'ops/node':>10}{'loss ops':>10}{'bytes/node':>11}"
    )
    print(head)
    for p in points:
        f, lo = p.formation, p.loss
        print(
            f"{p.backend:<8}{p.nodes:>7}  {fmt_s(f.seconds):>10}{fmt_s(f.cpu):>9}"
            f"{fmt_s(f.gc):>9}{fmt_s(f.server):>9}  {fmt_s(lo.seconds):>11}{fmt_s(lo.cpu):>9}"
            f"{fmt_s(lo.gc):>9}{fmt_s(lo.server):>9}  {fmt_s(p.generation):>9}"
            f"{per_node(f, p.nodes):>10.2f}{per_node(lo, p.nodes - 1):>10.2f}"
            f"{per_node(f, p.nodes, 'bytes'):>11.0f}"
        )
    print(
        "\nformation, loss->round: wall seconds; cpu: this process (every node, and the memory "
        "store); gc: the share of that cpu spent in the cyclic collector; server: the TCP store "
        "server's or etcd's process; ops, bytes: per node (bytes: values written and read)"
    )
    print("loss->gen: the in-place recovery generation core's CPU, failure -> formed")
    held = [p for p in points if math.isfinite(p.objects)]
    if held:
        print("\nwhat a node holds once its round formed (this process / N), and the collector")
        for p in held:
            print(
                f"{p.backend:<8}{p.nodes:>7}  {p.objects:>6.0f} tracked objects/node  "
                f"{p.tasks:>4.1f} tasks/node  full collections: formation {p.formation.full_gc}, "
                f"loss {p.loss.full_gc}"
            )
    print("\nstore operations per node, by operation")
    for p in points:
        for name, phase, size in (
            ("formation", p.formation, p.nodes),
            ("loss", p.loss, p.nodes - 1),
        ):
            detail = ", ".join(
                f"{op} {count / size:.2f}"
                for op, count in sorted(phase.ops.items())
                if op != "bytes"
            )
            print(f"{p.backend:<8}{p.nodes:>7} {name:<10} {detail}")


def growth(points: Sequence[Point]) -> None:
    """Cost ratio for each step in N, per backend: wall, and this process's CPU without GC."""
    print("\ngrowth from one size to the next and over each 10x in N (linear: as N grows)")

    def ratio(x: float, y: float) -> str:
        return f"x{y / x:.1f}" if x > 0 else "-"

    for backend in SIZES:
        mine = [p for p in points if p.backend == backend]
        tenfold = [(a, b) for a in mine for b in mine if b.nodes == 10 * a.nodes]
        steps = list(itertools.pairwise(mine))  # and issue 18's measure: each 10x in N
        for a, b in steps + [pair for pair in tenfold if pair not in steps]:
            fa, fb = a.formation, b.formation
            print(
                f"{backend:<8}{a.nodes:>6} -> {b.nodes:<6} N x{b.nodes / a.nodes:<5.1f} "
                f"formation wall {ratio(fa.seconds, fb.seconds):<6} "
                f"cpu {ratio(fa.cpu, fb.cpu):<6} cpu-gc {ratio(fa.cpu - fa.gc, fb.cpu - fb.gc):<6} "
                f"loss->round wall {ratio(a.loss.seconds, b.loss.seconds)}"
            )


def chart(points: Sequence[Point], path: Path) -> bool:
    """A log-log chart of time against N per backend and phase; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {"memory": "#2a9d8f", "tcp": "#e76f51", "etcd": "#264653", "etcd-shared": "#6d597a"}
    for backend, color in colors.items():
        mine = [p for p in points if p.backend == backend]
        if not mine:
            continue
        xs = [p.nodes for p in mine]
        ax.plot(
            xs,
            [p.formation.seconds for p in mine],
            "o-",
            color=color,
            label=f"{backend}: formation",
        )
        ax.plot(
            xs,
            [p.loss.seconds for p in mine],
            "s--",
            color=color,
            label=f"{backend}: loss -> next round",
        )
    memory = [p for p in points if p.backend == "memory"]
    if memory:  # one busy thread: its CPU is what its wall time is on an idle machine
        xs = [p.nodes for p in memory]
        cpu = [p.formation.cpu for p in memory]
        ax.plot(xs, cpu, "^-", color="#8ab17d", label="memory: formation CPU")
        own = [p.formation.cpu - p.formation.gc for p in memory]
        ax.plot(xs, own, "v-", color="#e9c46a", label="memory: formation CPU without GC")
        ax.plot(xs, [own[0] * x / xs[0] for x in xs], ":", color="grey", label="linear in N")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (N)")
    ax.set_ylabel("seconds (wall unless CPU; shared, loaded 2-core machine)")
    ax.set_title("aioelastic rendezvous: time against job size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def progress(point: Point, path: Path | None, points: Sequence[Point]) -> None:
    """Say a point is done (stderr), and keep every point so far in ``path``."""
    print(
        f"  {point.backend} N={point.nodes}: formation {point.formation.seconds:.3f} s, "
        f"loss -> round {point.loss.seconds:.3f} s",
        file=sys.stderr,
        flush=True,
    )
    if path is not None:
        path.write_text(json.dumps([asdict(p) for p in points], indent=1))


def chart_for(
    given: Path | None,
    backends: Sequence[str],
    sizes: Sequence[int] | None,
    quick: bool,
    from_json: Sequence[Path] | None,
) -> Path | None:
    """Where the chart goes: where asked, else the published chart for a whole run (every
    backend, every size) or a report of saved points; a partial run draws none."""
    if given is not None:
        return given
    whole = list(backends) == list(SIZES) and not sizes and not quick
    return CHART if whole or from_json else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small sizes only")
    parser.add_argument("--backends", nargs="*", choices=SIZES, default=list(SIZES))
    parser.add_argument("--sizes", type=int, nargs="*", help="these N instead of the defaults")
    parser.add_argument("--json", type=Path, help="also write the points here")
    parser.add_argument(
        "--from-json", type=Path, nargs="*", help="report on points saved by --json, no run"
    )
    parser.add_argument(
        "--chart",
        type=Path,
        help=f"write the chart here (default: {CHART.relative_to(CHART.parents[1])}, and only "
        "for a run of every backend at every size or a report --from-json, so a partial run "
        "never replaces the published chart)",
    )
    args = parser.parse_args()
    chart_path = chart_for(args.chart, args.backends, args.sizes, args.quick, args.from_json)
    if args.from_json:
        report(load_points(args.from_json), chart_path)
        return
    logging.disable(logging.CRITICAL)
    limit = raise_fd_limit()
    sizes = QUICK if args.quick else SIZES
    print(
        f"scale envelope: {os.cpu_count()} CPUs (shared), load {os.getloadavg()[0]:.2f}, "
        f"fd limit {limit}, last call {LAST_CALL:g} s (subtracted)"
    )
    points: list[Point] = []
    for backend in args.backends:
        wanted = args.sizes or sizes[backend]
        # each connection is one descriptor here and one in the server process
        chosen = [n for n in wanted if backend != "tcp" or n + 256 < limit]
        if backend.startswith("etcd"):
            from aioelastic.testing import EtcdCluster, find_etcd_binary

            binary = find_etcd_binary()
            if binary is None:
                print("etcd: no etcd binary, skipped")
                continue
            with tempfile.TemporaryDirectory() as tmp, EtcdCluster(binary, Path(tmp)) as cluster:
                process = cluster.members[0].process
                assert process is not None
                for n in chosen:
                    shared = backend == "etcd-shared"
                    points.append(etcd_point(n, cluster.endpoints, process.pid, shared=shared))
                    progress(points[-1], args.json, points)
            continue
        for n in chosen:
            point = memory_point(n) if backend == "memory" else tcp_point(n)
            if backend == "memory":
                point.generation = generation_seconds(n)
            points.append(point)
            progress(point, args.json, points)
    report(points, chart_path)


def report(points: Sequence[Point], chart_path: Path | None) -> None:
    """The tables, the growth lines and, given a path, the chart."""
    print_points(points)
    growth(points)
    if chart_path is not None and chart(points, chart_path):
        shown = chart_path.relative_to(CHART.parents[1]) if chart_path == CHART else chart_path
        print(f"\nchart: {shown}")


def load_points(paths: Sequence[Path]) -> list[Point]:
    """Points saved by ``--json`` (several files: merged, in backend then size order)."""
    points = []
    for path in paths:
        for saved in json.loads(path.read_text()):
            formation, loss = Phase(**saved.pop("formation")), Phase(**saved.pop("loss"))
            points.append(Point(formation=formation, loss=loss, **saved))
    order = list(SIZES)
    return sorted(points, key=lambda p: (order.index(p.backend), p.nodes))


if __name__ == "__main__":
    main()
