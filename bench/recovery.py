"""Recovery benchmark: a worker's ``kill -9`` -> every rank's first collective of the next world.

N gloo workers train (``bench/_recovery_worker.py``); once every rank finished its first
all_reduce, one rank is SIGKILLed and the clock runs until every rank of the next world has
finished its first all_reduce. Compared in the same run:

* ``aioelastic run --recovery in-place --spares 1``: a warm spare takes the rank;
* ``aioelastic run --recovery in-place``: a new process takes it (it must import torch);
* ``aioelastic run --recovery restart`` (today's default) and ``torchrun``: the group restarts.

Where the time goes (in-place, from the kill): *detect* (the agent saw the exit through its
pidfd), *announce* (the last survivor has its new world), *form* (every member
entered it: ``GenerationFormed``), *process group* (the last ``init_process_group`` returned),
*state transfer* (the fresh rank received 1 MiB from ``source_rank``), *first collective*.
Wall clock of one machine (every process reads the same clock). Run
``python -m bench.recovery [--sizes 4,8,16] [--repeat N]``; medians of N runs; the machine is
shared, so figures are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "bench" / "_recovery_worker.py")
BOUND = 120.0
"""Seconds one run may take before it counts as not recovered (torchrun hung here before)."""
STEPS, STEP_TIME = "60", "0.02"

Marks = list[dict[str, object]]


def launcher(mode: str, nproc: int, events: Path) -> list[str]:
    flags = ["--standalone", "--nproc-per-node", str(nproc)]
    if mode == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *flags, "--max-restarts", "1"]
    base = [sys.executable, "-m", "aioelastic", "run", *flags, "--events-file", str(events)]
    if mode == "restart":
        return [*base, "--max-restarts", "1"]
    spares = ["--spares", "1"] if mode == "spare" else []
    return [*base, "--recovery", "in-place", *spares]


def read_marks(out: Path) -> Marks:
    marks: Marks = []
    for path in out.glob("*.jsonl"):
        if path.name == "events.jsonl":
            continue
        marks += [json.loads(line) for line in path.read_text().splitlines() if line]
    return marks


def read_events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wait_until(check: Callable[[], bool], process: subprocess.Popen[bytes], bound: float) -> bool:
    """Poll ``check`` (a benchmark may; tests may not) until true, the run ends or time's up."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if check():
            return True
        if process.poll() is not None:
            return check()
        time.sleep(0.02)
    return False


def one_run(mode: str, nproc: int, workdir: Path) -> dict[str, float] | str:
    """One kill and recovery; the figures (seconds after the kill), or why there are none."""
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-{nproc}-", dir=workdir))
    events = out / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [*launcher(mode, nproc, events), WORKER, str(out), STEPS, STEP_TIME]
    with (out / "launcher.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=ROOT)
        try:
            return measure(mode, nproc, out, events, process)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def measure(
    mode: str, nproc: int, out: Path, events: Path, process: subprocess.Popen[bytes]
) -> dict[str, float] | str:
    def firsts(generation: int) -> Marks:
        return [m for m in read_marks(out) if m["name"] == "first" and m["gen"] == generation]

    def spare_waiting() -> bool:
        asking = [m for m in read_marks(out) if m["name"] == "asking"]
        return mode != "spare" or len(asking) > nproc

    if not wait_until(lambda: len(firsts(1)) == nproc and spare_waiting(), process, BOUND):
        return "did not start"
    victim = next(int(str(m["pid"])) for m in firsts(1) if m["rank"] == nproc // 2)
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    if not wait_until(lambda: len(firsts(2)) == nproc, process, BOUND):
        process.kill()
        return f"no recovery within {BOUND:g} s"
    marks = [m for m in read_marks(out) if m["gen"] == 2]

    def last(name: str, keep: Callable[[dict[str, object]], bool] = lambda m: True) -> float:
        times = [float(str(m["t"])) for m in marks if m["name"] == name and keep(m)]
        return max(times) - killed if times else float("nan")

    figures = {"first collective": last("first"), "process group": last("pg")}
    if mode in ("spare", "new"):
        survivors = {int(str(m["pid"])) for m in firsts(1)} - {victim}
        figures["announce"] = last("assigned", lambda m: int(str(m["pid"])) in survivors)
        figures["state transfer"] = last("state")
        for record in read_events(events):
            event = record["event"]
            if (
                record["kind"] == "GenerationFormed"
                and isinstance(event, dict)
                and event["generation"] == 2
            ):
                formed = float(str(record["time"]))
                figures["form"] = formed - killed
                figures["detect"] = formed - float(str(event["since_failure"])) - killed
    return figures


MODES = {
    "spare": "in-place, warm spare",
    "new": "in-place, new process",
    "restart": "restart (aioelastic)",
    "torchrun": "restart (torchrun)",
}
STAGES = ("detect", "announce", "form", "process group", "state transfer", "first collective")


def median(runs: list[dict[str, float] | str], key: str) -> float | str:
    values = [r[key] for r in runs if isinstance(r, dict) and key in r]
    if not values:
        failures = [r for r in runs if isinstance(r, str)]
        return failures[0] if failures else "n/a"
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,8,16", help="worker counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure")
    parser.add_argument("--torchrun-sizes", default="4", help="sizes torchrun is run at")
    parser.add_argument("--modes", default=",".join(MODES), help="a subset of " + ", ".join(MODES))
    options = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("recovery benchmark: skipped (torch is not installed)")
        return
    sizes = [int(s) for s in options.sizes.split(",")]
    torchrun_sizes = {int(s) for s in options.torchrun_sizes.split(",") if s}
    print(
        f"recovery benchmark: kill -9 of one of N gloo workers -> every rank's first "
        f"all_reduce of the next world; median of {options.repeat}; {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f} at start (shared: noisy)"
    )
    with tempfile.TemporaryDirectory(prefix="aioelastic-bench-recovery-") as tmp:
        for nproc in sizes:
            chosen = options.modes.split(",")
            modes = [m for m in chosen if m != "torchrun" or nproc in torchrun_sizes]
            runs = {m: [one_run(m, nproc, Path(tmp)) for _ in range(options.repeat)] for m in modes}
            print()
            print(f"{nproc} workers: failure -> first collective of the next world:")
            print(f"{'measure':40} {'aioelastic':>11} {'torchrun':>12} {'speed-up':>9}")
            theirs = median(runs.get("torchrun", ["not run"]), "first collective")
            for mode in ("spare", "new", "restart"):
                if mode not in runs:
                    continue
                ours = median(runs[mode], "first collective")
                label = f"{MODES[mode]} (s)"
                if isinstance(ours, str):
                    print(f"{label:40} {'n/a':>11} ({ours})")
                    continue
                ratio = f"{theirs / ours:8.1f}x" if isinstance(theirs, float) else "      n/a"
                theirs_text = f"{theirs:12.3f}" if isinstance(theirs, float) else f"{'n/a':>12}"
                print(f"{label:40} {ours:11.3f} {theirs_text} {ratio}")
            if isinstance(theirs, str):
                print(f"  torchrun: {theirs}")
            print()
            print(f"{nproc} workers: where the time goes (ms after the kill, last rank):")
            print(f"{'stage':40} {'spare':>11} {'new process':>12}")
            for stage in STAGES:
                cells = []
                for mode in ("spare", "new"):
                    value = median(runs.get(mode, ["not run"]), stage)
                    cells.append(f"{value * 1000:.1f}" if isinstance(value, float) else "n/a")
                print(f"{stage:40} {cells[0]:>11} {cells[1]:>12}")
            ours = median(runs.get("spare", ["not run"]), "first collective")
            if isinstance(ours, float):
                print(f"  target with a spare: under 100 ms; measured {ours * 1000:.1f} ms")


if __name__ == "__main__":
    main()
