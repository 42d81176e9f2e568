"""Rendezvous over etcd: formation time and store requests per round.

* N = 2, 8, 16 separate processes, each with its own handler and EtcdStore;
* 1,000 handlers in one process sharing one EtcdStore (``config["store"]``).

Formation time runs from the moment every node has connected and is told to go, to the
moment the last node's ``next_rendezvous()`` returned (the median of ``--repeat`` runs, each on
a fresh run id). Requests are gRPC calls (watches included) counted by the store, per node.
etcd is a local single-member cluster started here (``$AIOELASTIC_ETCD_BINARY`` or ``etcd`` on
PATH). There is no torch row: torch's etcd rendezvous speaks only etcd's v2 API (gone from
etcd 3.6); the targets come from issue 5. The machine is shared and has 2 cores: figures are
noisy. Run ``python -m bench.rendezvous_etcd``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.scale import proc_cpu

TARGETS = {2: 0.1, 8: 0.1, 16: 0.1, 1000: 3.0}  # seconds (issue 5 gives N=16 and N=1000)


def _params(endpoint: str, run_id: str, nodes: int, store: Any) -> Any:
    from aioelastic.rendezvous import RendezvousParameters

    return RendezvousParameters(
        backend="etcd",
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=nodes,
        max_nodes=nodes,
        store=store,
        join_timeout="120",
    )


# -- one node per process ---------------------------------------------------------------------


def node(endpoint: str, run_id: str, nodes: int, trace: bool = False) -> None:
    """A child process: connect, say ready, wait for the start time, rendezvous, report.

    With ``trace``, the handler's store calls are timed and reported too (the handler is then
    built on a timing wrapper of the store instead of through the backend's factory).
    """
    import anyio

    from aioelastic.rendezvous import RendezvousHandler, get_rendezvous_handler
    from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
    from aioelastic.rendezvous._parameters import ElasticSettings
    from aioelastic.store import EtcdStore
    from bench.rendezvous import TimingStore

    async def run() -> None:
        async with EtcdStore(endpoint, prefix="/bench/") as store:
            params = _params(endpoint, run_id, nodes, store)
            timing = TimingStore(store)
            handler: RendezvousHandler
            if trace:
                settings = ElasticSettings.from_parameters(params, extra_keys={"store"})
                handler = ElasticRendezvousHandler(
                    timing, settings, backend="etcd", local_addr="127.0.0.1"
                )
            else:
                handler = get_rendezvous_handler(params)
            async with handler:
                print("ready", flush=True)
                start = float(await anyio.to_thread.run_sync(sys.stdin.readline))
                await anyio.sleep_until(start)  # the loop clock is time.monotonic()
                before = store.statistics().requests
                timing.calls.clear()
                cpu = time.process_time()
                info = await handler.next_rendezvous()
                done = time.monotonic()
                cpu = time.process_time() - cpu
                requests = store.statistics().requests - before
                report: dict[str, Any] = {
                    "done": done,
                    "rank": info.rank,
                    "requests": requests,
                    "cpu": cpu,
                }
                report["calls"] = [(name, a - start, b - start) for name, a, b in timing.calls]
                print(json.dumps(report), flush=True)

    anyio.run(run)


def processes(
    endpoint: str, nodes: int, etcd_pid: int, trace: bool = False
) -> tuple[float, float, float, float]:
    """Formation time, requests per node, client CPU per node and etcd's CPU for ``nodes``
    processes (CPU: seconds, from go to the round; the client's includes gRPC's threads).

    Every child starts at one instant of the shared monotonic clock, so the time it takes to
    tell them to go is not counted. With ``trace``, the store calls of the last node and of
    the sealers are printed.
    """
    run_id = uuid.uuid4().hex[:8]
    command = [sys.executable, "-m", "bench.rendezvous_etcd", "node", endpoint, run_id, str(nodes)]
    command += ["trace"] if trace else []
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(nodes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("a benchmark node failed to connect")
        start = time.monotonic() + 0.2 + 0.02 * nodes
        etcd_cpu = proc_cpu(etcd_pid)
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{start!r}\n")
            child.stdin.flush()
        reports = []
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"a benchmark node exited with code {child.wait()}")
            reports.append(json.loads(line))
        etcd_cpu = proc_cpu(etcd_pid) - etcd_cpu
    finally:
        for child in children:
            child.wait(timeout=60)
    if sorted(r["rank"] for r in reports) != list(range(nodes)):
        raise RuntimeError(f"ranks are not 0..{nodes - 1}: {reports}")
    formation = max(r["done"] for r in reports) - start
    if trace:
        last = max(reports, key=lambda r: r["done"])
        sealers = [r for r in reports if any(c[0] == "compare_set" for c in r["calls"])]
        for who, report in [("the last node", last)] + [("a sealer", r) for r in sealers]:
            calls = ", ".join(f"{n} {a * 1000:.1f}-{b * 1000:.1f}" for n, a, b in report["calls"])
            print(f"  N={nodes}, {who} (rank {report['rank']}), ms from go: {calls}")
    requests = statistics.mean(r["requests"] for r in reports)
    return formation, requests, statistics.mean(r["cpu"] for r in reports), etcd_cpu


# -- many handlers in one process -----------------------------------------------------------------


def in_process(endpoint: str, nodes: int, etcd_pid: int) -> tuple[float, float, float, float]:
    """Formation time, requests per node, this process's CPU per node and etcd's CPU for
    ``nodes`` handlers sharing one store."""
    import anyio

    from aioelastic.rendezvous import get_rendezvous_handler
    from aioelastic.store import EtcdStore

    run_id = uuid.uuid4().hex[:8]
    result: list[float] = []

    async def run() -> None:
        async with EtcdStore(endpoint, prefix="/bench/") as store:
            go, connected, formed = anyio.Event(), anyio.Event(), anyio.Event()
            ranks: list[int] = []
            entered = 0

            async def one() -> None:
                nonlocal entered
                async with get_rendezvous_handler(_params(endpoint, run_id, nodes, store)) as h:
                    entered += 1
                    if entered == nodes:
                        connected.set()
                    await go.wait()
                    ranks.append((await h.next_rendezvous()).rank)
                    if len(ranks) == nodes:
                        formed.set()

            async with anyio.create_task_group() as tg:
                for _ in range(nodes):
                    tg.start_soon(one)
                await connected.wait()
                before = store.statistics().requests
                start, cpu, etcd_cpu = time.monotonic(), time.process_time(), proc_cpu(etcd_pid)
                go.set()
                await formed.wait()
                result.append(time.monotonic() - start)
                result.append((store.statistics().requests - before) / nodes)
                result.append((time.process_time() - cpu) / nodes)
                result.append(proc_cpu(etcd_pid) - etcd_cpu)
            if sorted(ranks) != list(range(nodes)):
                raise RuntimeError(f"ranks are not 0..{nodes - 1}")

    anyio.run(run)
    return result[0], result[1], result[2], result[3]


# -- the table --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="*", default=[2, 8, 16])
    parser.add_argument("--handlers", type=int, default=1000)
    parser.add_argument(
        "--trace", action="store_true", help="print the last node's store calls of each run"
    )
    args = parser.parse_args()

    from aioelastic.testing import HOW_TO_GET_ETCD, EtcdCluster, find_etcd_binary

    binary = find_etcd_binary()
    if binary is None:
        sys.exit(f"no etcd binary: {HOW_TO_GET_ETCD}")
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(binary, Path(tmp)) as cluster:
        endpoint = cluster.endpoints
        process = cluster.members[0].process
        assert process is not None
        traced = functools.partial(processes, trace=args.trace)
        cases: list[tuple[str, int, Any]] = [
            (f"N={n} processes", n, traced) for n in args.processes
        ]
        if args.handlers:
            cases.append((f"{args.handlers} handlers, 1 process", args.handlers, in_process))
        print(
            f"etcd rendezvous formation, local single-member etcd, median of {args.repeat}, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print(
            f"{'case':<28}{'aioelastic':>12}{'min-max':>16}{'target':>10}{'target/ours':>13}"
            f"{'requests/node':>15}{'cpu/node':>10}{'etcd cpu':>10}"
        )
        for label, nodes, measure in cases:
            runs = [measure(endpoint, nodes, process.pid) for _ in range(args.repeat)]
            times = sorted(r[0] * 1000 for r in runs)
            milliseconds = statistics.median(times)
            requests = statistics.median(r[1] for r in runs)
            target = TARGETS.get(nodes)
            ratio = f"{target * 1000 / milliseconds:.1f}x" if target else "-"
            shown = f"{target * 1000:.0f} ms" if target else "-"
            spread = f"{times[0]:.0f}-{times[-1]:.0f} ms"
            cpu = statistics.median(r[2] for r in runs) * 1000
            etcd_cpu = statistics.median(r[3] for r in runs) * 1000
            print(
                f"{label:<28}{milliseconds:>9.1f} ms{spread:>16}{shown:>10}{ratio:>13}"
                f"{requests:>15.1f}{cpu:>7.1f} ms{etcd_cpu:>7.0f} ms"
            )
        print("torch: no etcd v3 rendezvous to compare with (its etcd backend is v2-only)")
        print(
            "cpu/node: a node's CPU from go to its round (gRPC's threads included; in-process: "
            "the process's CPU / N); etcd cpu: the etcd process's over the formation"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        node(sys.argv[2], sys.argv[3], int(sys.argv[4]), trace=sys.argv[5:] == ["trace"])
    else:
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        main()
