"""Preemption benchmark: SIGTERM to one of three nodes' launchers -> every rank stopped.

Three launchers on this machine form one job (c10d on loopback), two gloo workers each
(``bench/_preemption_worker.py``: an all_reduce a step). Once every rank trains, one launcher
(not the store's host) gets SIGTERM; the clock runs until every launcher exited. Compared in
the same run:

* ``aioelastic run``: the job is preempted; every rank saves at one step (``should_stop``);
* ``torchrun``: the signal reaches the workers of the node that got it (their SIGTERM handler
  saves); the other nodes' ranks see their collective break.

Reported (medians of ``--repeat`` runs): signal -> last save, signal -> every launcher exited,
ranks saved (of 6) and whether they saved at one step; and the CPU one ``should_stop`` costs a
step without a notice. Run ``python -m bench.preemption``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "bench" / "_preemption_worker.py")
NODES, NPROC, STEP_TIME = 3, 2, "0.01"
BOUND = 120.0
"""Seconds one run may take; a launcher still running then is killed (and the run says so)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launcher(mode: str, port: int) -> list[str]:
    flags = [
        "--nnodes", str(NODES), "--nproc-per-node", str(NPROC), "--max-restarts", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
    ]  # fmt: skip
    if mode == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *flags, "--monitor-interval", "0.1"]
    return [sys.executable, "-m", "aioelastic", "run", *flags]


def poll(check: Callable[[], bool], bound: float) -> bool:
    """Poll ``check`` (a benchmark may; tests may not) until it is true or time's up."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def one_run(mode: str, workdir: Path) -> dict[str, float] | str:
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=workdir))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    processes = []
    for node in range(NODES):
        log = (out / f"launcher-{node}.log").open("wb")
        command = [*launcher(mode, port), WORKER, str(out), STEP_TIME]
        processes.append(subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=ROOT))
        if node == 0:
            time.sleep(0.5)  # the store's host first (torchrun's c10d needs it up)
    try:
        if not poll(lambda: len(list(out.glob("training-*"))) == NODES * NPROC, BOUND):
            return "did not start"
        signalled = time.time()
        processes[1].send_signal(signal.SIGTERM)
        if not poll(lambda: all(p.poll() is not None for p in processes), BOUND):
            return f"launchers still running {BOUND:g} s after the signal"
        exited = time.time() - signalled
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    saved = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    steps = {record["step"] for record in saved}
    last = max((record["t"] for record in saved), default=float("nan")) - signalled
    return {
        "last save": last,
        "every launcher exited": exited,
        "saved": float(len(saved)),
        "one step": float(len(steps) == 1 and len(saved) == NODES * NPROC),
    }


def should_stop_cpu(calls: int = 200_000) -> float:
    """CPU microseconds of one ``should_stop`` without a notice (a connected link; CPU time, so
    a loaded machine does not inflate it)."""
    from aioelastic.worker._preemption import PreemptionLink

    ours, theirs = socket.socketpair()
    with ours, theirs:
        link = PreemptionLink(ours)
        started = time.process_time()
        for step in range(calls):
            link.should_stop(step)
        return (time.process_time() - started) / calls * 1e6


def median(runs: list[dict[str, float] | str], key: str) -> float | str:
    values = [r[key] for r in runs if isinstance(r, dict)]
    if not values:
        return next((r for r in runs if isinstance(r, str)), "n/a")
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per launcher")
    options = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("preemption benchmark: skipped (torch is not installed)")
        return
    print(
        f"preemption benchmark: {NODES} nodes x {NPROC} gloo workers on loopback, SIGTERM to "
        f"node 1's launcher; median of {options.repeat}; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f} at start (shared: noisy)"
    )
    with tempfile.TemporaryDirectory(prefix="aioelastic-bench-preemption-") as tmp:
        runs = {}
        for mode in ("aioelastic", "torchrun"):
            runs[mode] = [one_run(mode, Path(tmp)) for _ in range(options.repeat)]
    print()
    print(f"{'measure':32} {'aioelastic':>11} {'torchrun':>11}")
    for key, unit in (
        ("last save", "s"),
        ("every launcher exited", "s"),
        ("saved", f"of {NODES * NPROC}"),
        ("one step", "runs, of 1"),
    ):
        cells = []
        for mode in ("aioelastic", "torchrun"):
            value = median(runs[mode], key)
            cells.append(f"{value:11.3f}" if isinstance(value, float) else f"{'n/a':>11}")
        print(f"{key + f' ({unit})':32} {cells[0]} {cells[1]}")
    for mode, mode_runs in runs.items():
        for run in mode_runs:
            if isinstance(run, str):
                print(f"  {mode}: {run}")
    ours, theirs = median(runs["aioelastic"], "saved"), median(runs["torchrun"], "saved")
    if isinstance(ours, float) and isinstance(theirs, float) and theirs:
        print(f"ranks saved: {ours / theirs:.1f}x torchrun's")
    print(f"should_stop without a notice: {should_stop_cpu():.2f} us of CPU a step")


if __name__ == "__main__":
    main()
