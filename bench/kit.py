"""The public test kit at scale: ``RendezvousCluster(N)`` started, one round, stopped.

Each size runs in a fresh interpreter, twice: with the kit as it is (it sizes the cyclic
collector's young generation to its nodes while entered, ``aioelastic/testing/_collector.py``)
and with the collector at CPython's default thresholds (the reference: what the kit cost
before). CPU seconds of this process, of which the collector's, and the full collections; then
the growth over each 10x in N (linear: x10). Each cell is the fastest of ``--repeat`` runs (the
machine is shared). Run ``python -m bench.kit [--sizes N ...] [--repeat K]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import anyio

SIZES = (1000, 10000)
PHASES = ("enter", "round", "leave")


class Meter:
    """CPU seconds the collector takes, and its full collections, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.process_time()
            return
        self.seconds += time.process_time() - self._start
        self.full += info["generation"] == 2

    def read(self) -> tuple[float, float, int]:
        return time.process_time(), self.seconds, self.full


async def one_size(nodes: int) -> dict[str, list[float]]:
    """Enter, form one round of, and leave a cluster of ``nodes``: (cpu, collector, full)."""
    from aioelastic.testing import RendezvousCluster

    gc.collect()
    meter = Meter()
    marks = [meter.read()]
    async with RendezvousCluster(nodes) as cluster:
        marks.append(meter.read())
        infos = await cluster.rendezvous()
        marks.append(meter.read())
    marks.append(meter.read())
    assert len(infos) == nodes
    return {
        phase: [b - a for a, b in zip(marks[i], marks[i + 1], strict=True)]
        for i, phase in enumerate(PHASES)
    }


def child(nodes: int, default: bool) -> None:
    if default:
        import aioelastic.testing._collector as collector

        collector.YOUNG_PER_NODE = 0  # the kit asks for nothing: CPython's thresholds stay
    print(json.dumps(anyio.run(one_size, nodes)))


def measure(nodes: int, default: bool, repeat: int) -> dict[str, list[float]]:
    """The run of least CPU in all of ``repeat`` fresh interpreters."""
    command = [sys.executable, "-m", "bench.kit", "--child", str(nodes)]
    runs: list[dict[str, list[float]]] = []
    for _ in range(repeat):
        done = subprocess.run(
            command + (["--default"] if default else []),
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout))
    return min(runs, key=lambda run: sum(cpu for cpu, _, _ in run.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--repeat", type=int, default=3, help="runs a cell (the fastest counts)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--default", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.default)
        return
    print(f"test kit: {os.cpu_count()} CPUs (shared), load {os.getloadavg()[0]:.2f}")
    print(
        f"{'collector':<10}{'N':>7}"
        + "".join(f"{p + ' cpu':>12}{'gc':>8}{'full':>5}" for p in PHASES)
    )
    results = {}
    for nodes in args.sizes:
        for default in (True, False):
            got = results[default, nodes] = measure(nodes, default, args.repeat)
            cells = "".join(f"{got[p][0]:>12.3f}{got[p][1]:>8.3f}{got[p][2]:>5.0f}" for p in PHASES)
            print(f"{'default' if default else 'kit':<10}{nodes:>7}{cells}", flush=True)
    print("cpu, gc: CPU seconds of the process, of which the cyclic collector's; full: its full")
    print("collections. default: CPython's thresholds (the kit before); kit: sized to the nodes")
    print("\ngrowth over 10x in N (linear: x10)")
    for default in (True, False):
        for small in args.sizes:
            if small * 10 in args.sizes:
                a, b = results[default, small], results[default, small * 10]
                ratios = "  ".join(f"{p} x{b[p][0] / a[p][0]:.1f}" for p in PHASES)
                print(f"{'default' if default else 'kit':<10}{small} -> {small * 10}  {ratios}")


if __name__ == "__main__":
    main()
