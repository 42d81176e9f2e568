"""The blocking client (``BlockingTCPStore``) against torch's C++ ``TCPStore`` client.

One client, one call at a time, each of ``set``, ``get``, ``add``, ``compare_set``:

* ``blocking -> ours``: our blocking client against our server;
* ``torch -> torch``: torch's client against torch's C++ server;
* ``torch -> ours``: torch's client against our server (torch's protocol on the same port).

Each server runs in its own process (``bench.store``'s hosts); the clients run here, in turn,
``--rounds`` times, and each row is the median round: calls per second, then the client's and
the server's CPU time per call (CPU figures hold up better than rates on a shared machine).
A last table puts the blocking client against torch's, each on its own server, in the form
``make bench`` reads (``get`` in torch's client is a wait and a get: two round trips; its
``set`` does not wait for a reply, so it has no row there).

    python -m bench.store_blocking [--ops N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

from bench import store as bench
from bench.store import HAVE_TORCH, VALUE, Rate, server, timed, torch_sequential

OPS = ("set", "get", "add", "compare_set")


def blocking_sequential(port: int, server_pid: int) -> dict[str, Rate]:
    """Our blocking client, one call at a time, for each op (``set`` writes what ``get`` reads)."""
    from aioelastic.store import BlockingTCPStore

    with BlockingTCPStore("127.0.0.1", port) as s:
        for i in range(100):
            s.set(f"warm{i}", VALUE)
        n = bench.SEQUENTIAL_OPS
        calls: dict[str, Callable[[], object]] = {
            "set": lambda: [s.set(f"k{i}", VALUE) for i in range(n)],
            "get": lambda: [s.get(f"k{i}") for i in range(n)],
            "add": lambda: [s.add("counter", 1) for _ in range(n)],
            "compare_set": lambda: [s.compare_set("k0", VALUE, VALUE) for _ in range(n)],
        }
        return {op: timed(n, calls[op], server_pid) for op in OPS}


def median(rates: list[Rate]) -> Rate:
    return Rate(
        statistics.median(r.per_second for r in rates),
        statistics.median(r.client_us for r in rates),
        statistics.median(r.server_us for r in rates),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=bench.SEQUENTIAL_OPS, help="calls per row")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    bench.SEQUENTIAL_OPS = options.ops
    rows: dict[str, dict[str, list[Rate]]] = {}
    with server("ours") as (ours_port, ours_pid):
        if HAVE_TORCH:
            torch_server = server("torch")
            torch_port, torch_pid = torch_server.__enter__()
        try:
            for _ in range(options.rounds):
                runs = {"blocking -> ours": lambda: blocking_sequential(ours_port, ours_pid)}
                if HAVE_TORCH:
                    runs["torch -> torch"] = lambda: torch_sequential(torch_port, torch_pid, OPS)
                    runs["torch -> ours"] = lambda: torch_sequential(ours_port, ours_pid, OPS)
                for name, run in runs.items():
                    for op, rate in run().items():
                        rows.setdefault(name, {}).setdefault(op, []).append(rate)
        finally:
            if HAVE_TORCH:
                torch_server.__exit__(None, None, None)
    load = os.getloadavg()
    print(
        f"sequential calls, {options.ops} per row, median of {options.rounds} rounds, "
        f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print(f"{'op':<12} {'client -> server':<18} {'calls/s':>9} {'client us':>10} {'server us':>10}")
    for op in OPS:
        for name in rows:
            rate = median(rows[name][op])
            print(
                f"{op:<12} {name:<18} {rate.per_second:>9.0f} {rate.client_us:>10.1f} "
                f"{rate.server_us:>10.1f}"
            )
    if "torch -> torch" not in rows:
        print("torch rows skipped: torch is not installed")
        return
    print()
    print("blocking clients, each against its own server: BlockingTCPStore vs torch's C++ client")
    print(f"{'workload':<34} {'unit':<7} {'aioelastic':>12} {'torch':>12} {'ratio':>7}")
    for op in OPS[1:]:  # torch's set does not wait for its reply: no like for like
        ours, theirs = median(rows["blocking -> ours"][op]), median(rows["torch -> torch"][op])
        figures = (
            (f"sequential {op}", "ops/s", ours.per_second, theirs.per_second),
            (f"  {op}: client CPU per op", "us", ours.client_us, theirs.client_us),
            (f"  {op}: server CPU per op", "us", ours.server_us, theirs.server_us),
        )
        for name, unit, mine, reference in figures:
            ratio = mine / reference if reference else float("nan")
            print(f"{name:<34} {unit:<7} {mine:>12,.1f} {reference:>12,.1f} {ratio:>7.2f}")


if __name__ == "__main__":
    main()
