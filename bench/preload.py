"""Preload benchmark: workers forked from a warm template (``--preload``) against plain starts.

The workload is ``bench/recovery.py``'s (N gloo workers in generations of the world); every
figure is measured in the same run for ``aioelastic run`` without and with ``--preload
torch,aioelastic.worker``, and for torchrun where it applies:

* *in-place, no spare*: a worker's ``kill -9`` -> every rank's first all_reduce of the next
  world (the replacement is a new process: plain, it imports torch; preloaded, a fork);
* *restart*: the same with ``--recovery restart`` (the whole group starts again) and torchrun;
* *job start*: launch -> every rank's first all_reduce (wall), and the total proportional set
  size (PSS, ``/proc/PID/smaps_rollup``) of the workers (and the template) while they train.

*Plain* is ``--fork-template off``: no template at all (``bench.recovery`` measures the one the
agent learns by default).

Run ``python -m bench.preload [--nproc 4] [--repeat 3]``; medians of the runs. The machine is
shared: compare the ratios of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.recovery import (
    BOUND,
    ROOT,
    STEP_TIME,
    WORKER,
    measure,
    read_events,
    read_marks,
    wait_until,
)

PRELOAD = ("--preload", "torch,aioelastic.worker")
STEPS = "400"
"""Long enough that the workers still train while their memory is read."""


def launcher(mode: str, nproc: int, events: Path) -> list[str]:
    """``mode``: plain or preload restart/new (in place) or start, or torchrun."""
    flags = ["--standalone", "--nproc-per-node", str(nproc)]
    if mode == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *flags, "--max-restarts", "1"]
    base = [sys.executable, "-m", "aioelastic", "run", *flags, "--events-file", str(events)]
    base += PRELOAD if mode.endswith("+preload") else ["--fork-template", "off"]
    if mode.startswith("new"):
        return [*base, "--recovery", "in-place"]
    return [*base, "--max-restarts", "1"]


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pss_kib(pid: int) -> int:
    """The proportional set size of ``pid`` in KiB (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)


def is_python(pid: int) -> bool:
    """Whether ``pid`` runs a Python interpreter (not the ``setpriv`` or guardian shells)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and b"python" in cmdline[0] and b"_guardian_main" not in b" ".join(cmdline)


def start_run(mode: str, nproc: int, workdir: Path) -> dict[str, float] | str:
    """Launch -> every rank's first all_reduce (s), then the workers' total PSS (MiB)."""
    out = Path(tempfile.mkdtemp(prefix=f"start-{mode}-{nproc}-", dir=workdir))
    events = out / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [*launcher(mode, nproc, events), WORKER, str(out), STEPS, STEP_TIME]
    with (out / "launcher.log").open("wb") as log:
        started = time.time()
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=ROOT)
        try:

            def firsts() -> int:
                return len([m for m in read_marks(out) if m["name"] == "first"])

            if not wait_until(lambda: firsts() >= nproc, process, BOUND):
                return "did not start"
            wall = max(float(str(m["t"])) for m in read_marks(out) if m["name"] == "first")
            processes = [p for p in descendants(process.pid) if is_python(p)]
            total = sum(pss_kib(p) for p in processes)
            figures = {"wall": wall - started, "pss": total / 1024, "processes": len(processes)}
            for record in read_events(events):
                event = record["event"]
                if record["kind"] == "TemplateReady" and isinstance(event, dict):
                    figures["template import"] = float(str(event["seconds"]))
            return figures
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def recovery_run(mode: str, nproc: int, workdir: Path) -> dict[str, float] | str:
    """One kill and recovery: seconds from the kill to every rank's first collective."""
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-{nproc}-", dir=workdir))
    events = out / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [*launcher(mode, nproc, events), WORKER, str(out), "60", STEP_TIME]
    with (out / "launcher.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=ROOT)
        try:
            kind = "new" if mode.startswith("new") else "restart"
            return measure(kind, nproc, out, events, process)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def median(runs: list[dict[str, float] | str], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r, dict) and key in r]
    return statistics.median(values) if values else None


def cell(value: float | None, unit: str = "s") -> str:
    if value is None:
        return f"{'n/a':>12}"
    return f"{value:10.3f} {unit}" if unit == "s" else f"{value:9.0f} {unit}"


def ratio(reference: float | None, ours: float | None) -> str:
    if reference is None or ours is None or ours == 0:
        return f"{'n/a':>9}"
    return f"{reference / ours:8.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="workers")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun runs")
    options = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("preload benchmark: skipped (torch is not installed)")
        return
    nproc, repeat = options.nproc, options.repeat
    print(
        f"preload benchmark: {nproc} gloo workers, plain starts vs forks of a template that "
        f"preloaded torch; median of {repeat}; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f} at start (shared machine: compare ratios within this run)"
    )
    with tempfile.TemporaryDirectory(prefix="aioelastic-bench-preload-") as tmp:
        work = Path(tmp)
        recovery_modes = ["new", "new+preload", "restart", "restart+preload"]
        if not options.no_torchrun:
            recovery_modes.append("torchrun")
        start_modes = ["start", "start+preload", *([] if options.no_torchrun else ["torchrun"])]
        runs: dict[str, list[dict[str, float] | str]] = {m: [] for m in recovery_modes}
        starts: dict[str, list[dict[str, float] | str]] = {m: [] for m in start_modes}
        for _ in range(repeat):  # interleaved: load changes hit every mode alike
            for mode in recovery_modes:
                runs[mode].append(recovery_run(mode, nproc, work))
            for mode in start_modes:
                starts[mode].append(start_run(mode, nproc, work))
    first = {m: median(r, "first collective") for m, r in runs.items()}
    print()
    print(f"failure -> every rank's first collective of the next world ({nproc} workers):")
    print(f"{'path':34} {'plain':>12} {'--preload':>12} {'speed-up':>9}")
    for label, plain, forked in (
        ("in-place, no spare", "new", "new+preload"),
        ("--recovery restart", "restart", "restart+preload"),
    ):
        print(
            f"{label:34} {cell(first[plain])} {cell(first[forked])} "
            f"{ratio(first[plain], first[forked])}"
        )
    if "torchrun" in first:
        print(
            f"{'torchrun restart':34} {cell(first['torchrun'])} {'':>12} "
            f"{ratio(first['torchrun'], first['restart+preload'])} (torchrun / --preload restart)"
        )
    for mode, mode_runs in runs.items():
        failed = [r for r in mode_runs if isinstance(r, str)]
        if failed:
            print(f"  {mode}: {len(failed)} run(s) failed: {failed[0]}")
    print()
    print(f"job start of {nproc} workers (launch -> every rank's first collective):")
    print(f"{'launcher':34} {'wall':>12} {'total PSS':>12} {'processes':>10}")
    for mode, label in (
        ("start", "aioelastic run"),
        ("start+preload", "aioelastic run --preload"),
        ("torchrun", "torchrun"),
    ):
        if mode not in starts:
            continue
        count = median(starts[mode], "processes")
        shown = "n/a" if count is None else f"{count:.0f}"
        print(
            f"{label:34} {cell(median(starts[mode], 'wall'))} "
            f"{cell(median(starts[mode], 'pss'), 'MiB')} {shown:>10}"
        )
    imported = median(starts["start+preload"], "template import")
    if imported is not None:
        print(f"  the template's own import of torch,aioelastic.worker: {imported:.3f} s")
    plain_pss, forked_pss = median(starts["start"], "pss"), median(starts["start+preload"], "pss")
    if plain_pss and forked_pss:
        print(f"  PSS with --preload / plain: {forked_pss / plain_pss:.2f}")


if __name__ == "__main__":
    main()
