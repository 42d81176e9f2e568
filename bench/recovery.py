"""Recovery benchmark: a worker's ``kill -9`` -> every rank's next optimizer step of DDP.

N gloo workers train a model with DistributedDataParallel (``bench/_recovery_ddp_worker.py``,
written as most scripts are: ``DDP(model)``, then the optimizer over ``ddp.parameters()``); once
they are past their second checkpoint (and, with a spare, the spare said it is warm), one rank is
SIGKILLed and the clock runs until every rank of the next world has taken its next optimizer
step, and until every rank is back at the step the job had reached (*caught up*: a restart
loads the last checkpoint and re-does the steps after it; they are counted as *lost steps*).
Compared in the same run:

* ``aioelastic run --recovery in-place --spares 1``: a warm spare takes the rank and gets the
  state from a survivor (``worker.hand_over``);
* ``aioelastic run --recovery in-place``: a new process takes it (it must import torch);
* ``aioelastic run --recovery restart`` and ``torchrun``: the group restarts from the checkpoint
  (ours forks it from the template the agent learned; ``restart-plain`` is the same with
  ``--fork-template off``, every worker importing torch again as torchrun's do).

Our modes kill only once the agent's template holds what a new worker needs (a job runs a while
before it fails; see ``template_holds``).

Where the time goes (from the kill, the last rank): *detect* (the agent saw the exit through its
pidfd), *world formed* (``GenerationFormed``), *process group* (the last
``init_process_group`` returned), *state to fresh ranks* (``hand_over``, or the checkpoint
loaded), *DDP wrap*, *first step*. ``--model 100m`` trains about 100M parameters (400 MB of
state to hand over); ``--workload allreduce`` is the earlier benchmark (every rank's first
``all_reduce`` of the next world, 1 MiB of state). Wall clock of one machine (every process
reads the same clock). Run ``python -m bench.recovery [--sizes 4,8,16] [--repeat N]``; medians
of N runs; the machine is shared, so figures are noisy: compare ratios to torchrun's.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "bench" / "_recovery_worker.py")
DDP_WORKER = str(ROOT / "bench" / "_recovery_ddp_worker.py")
BOUND = 120.0
"""Seconds one run may take before it counts as not recovered (torchrun hung here before)."""
STEPS, STEP_TIME = "1000000", "0.02"
"""The all_reduce job too runs until the benchmark has its figures."""
DDP_STEPS = "1000000"
"""The DDP job runs until the benchmark has its figures (it is stopped then)."""
MODELS = {"mlp": (64, 256, 2), "100m": (4096, 4096, 6)}
"""Width in, hidden width, layers (as ``bench/_recovery_ddp_worker.py`` has them)."""
DDP_SHAPE = {"mlp": ("0.02", 10), "100m": ("0", 4)}
"""Per model: seconds a step sleeps, steps between checkpoints."""

Marks = list[dict[str, object]]


def launcher(mode: str, nproc: int, events: Path) -> list[str]:
    flags = ["--standalone", "--nproc-per-node", str(nproc)]
    if mode == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *flags, "--max-restarts", "1"]
    base = [sys.executable, "-m", "aioelastic", "run", *flags, "--events-file", str(events)]
    if mode == "restart-plain":
        return [*base, "--max-restarts", "1", "--fork-template", "off"]
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


def template_holds(events: Path, mode: str, ddp: bool) -> bool:
    """Whether the node's fork template imported what a new worker of ``mode`` needs warm
    (``TemplateLearned`` events): torch, and under DDP the ``torch._dynamo`` that DDP's first
    call loads (learned from a restarted worker's recorded imports, or an in-place one's
    report). A job runs a while before it fails; the benchmark waits for what the agent
    learns in that while (torchrun learns nothing)."""
    if mode not in ("restart", "new"):
        return True
    learned = {
        name
        for record in read_events(events)
        if record["kind"] == "TemplateLearned" and isinstance(record["event"], dict)
        for name in record["event"]["modules"]  # type: ignore[union-attr]
    }
    return "torch" in learned and (not ddp or "torch._dynamo" in learned)


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


def one_run(
    mode: str, nproc: int, workdir: Path, model: str | None, sync: str = "always"
) -> dict[str, float] | str:
    """One kill and recovery; the figures (seconds after the kill), or why there are none.
    ``model``: the DDP workload with that model (None: the all_reduce one)."""
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-{nproc}-", dir=workdir))
    events = out / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if model is None:
        script = [WORKER, str(out), STEPS, STEP_TIME]
    else:
        step_time, every = DDP_SHAPE[model]
        script = [DDP_WORKER, str(out), DDP_STEPS, step_time, model, str(every), sync]
    command = [*launcher(mode, nproc, events), *script]
    with (out / "launcher.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=ROOT)
        try:
            if model is None:
                return measure(mode, nproc, out, events, process)
            return measure_ddp(mode, nproc, out, events, process, DDP_SHAPE[model][1])
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

    def started() -> bool:
        return len(firsts(1)) == nproc and spare_waiting() and template_holds(events, mode, False)

    if not wait_until(started, process, BOUND):
        return "did not start (or the spare or the template did not warm)"
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


def _at(marks: Marks, name: str) -> list[float]:
    return [float(str(m["t"])) for m in marks if m["name"] == name]


def measure_ddp(
    mode: str, nproc: int, out: Path, events: Path, process: subprocess.Popen[bytes], every: int
) -> dict[str, float] | str:
    """The DDP workload's figures: stages, next step, caught up (seconds), lost steps."""

    def steps(generation: int) -> dict[int, int]:
        """Rank -> the last step it finished in ``generation``."""
        done: dict[int, int] = {}
        for m in read_marks(out):
            if m["name"] == "step" and m["gen"] == generation:
                rank = int(str(m["rank"]))
                done[rank] = max(done.get(rank, 0), int(str(m["step"])))
        return done

    def ready() -> bool:
        done = steps(1)
        warm = mode != "spare" or any(m["name"] == "warm" for m in read_marks(out))
        warm = warm and template_holds(events, mode, True)
        return len(done) == nproc and min(done.values()) >= 2 * every and warm

    if not wait_until(ready, process, BOUND * 3):
        return "did not start (or the spare or the template did not warm)"
    # Kill half way between two checkpoints: a restart then re-does about every/2 steps.
    if not wait_until(lambda: steps(1).get(0, 0) % every == every // 2, process, BOUND):
        return "did not reach the kill step"
    victim = next(
        int(str(m["pid"]))
        for m in read_marks(out)
        if m["name"] == "assigned" and m["gen"] == 1 and m["rank"] == nproc // 2
    )
    killed = time.time()
    os.kill(victim, signal.SIGKILL)

    def recovered() -> bool:
        return len(steps(2)) == nproc and min(steps(2).values()) > max(steps(1).values())

    if not wait_until(recovered, process, BOUND * 3):
        process.kill()
        return f"no recovery within {BOUND * 3:g} s"
    reached = max(steps(1).values())
    marks = [m for m in read_marks(out) if m["gen"] == 2]

    def last(name: str) -> float:
        times = _at(marks, name)
        return max(times) - killed if times else float("nan")

    def last_first(keep: Callable[[dict[str, object]], bool]) -> float:
        """When the last rank did its first mark that ``keep`` takes (after the kill)."""
        firsts: dict[int, float] = {}
        for m in marks:
            if keep(m):
                rank, t = int(str(m["rank"])), float(str(m["t"]))
                firsts[rank] = min(firsts.get(rank, t), t)
        return max(firsts.values()) - killed

    figures = {
        "process group": last("pg"),
        "state to fresh ranks": last("state"),
        "DDP wrap": last("ddp"),
        "next step": last_first(lambda m: m["name"] == "step"),
        "caught up": last_first(lambda m: m["name"] == "step" and int(str(m["step"])) > reached),
    }
    fresh_state = [float(str(m["t"])) for m in marks if m["name"] == "state" and m["fresh"]]
    if fresh_state and _at(marks, "pg"):
        figures["hand-over"] = max(fresh_state) - max(_at(marks, "pg"))
    resumed = [int(str(m["resumed"])) for m in marks if m["name"] == "state" and "resumed" in m]
    figures["lost steps"] = float(reached - min(resumed)) if resumed else 0.0
    for record in read_events(events):
        event = record["event"]
        if (
            record["kind"] == "GenerationFormed"
            and isinstance(event, dict)
            and event["generation"] == 2
        ):
            formed = float(str(record["time"]))
            figures["world formed"] = formed - killed
            figures["detect"] = formed - float(str(event["since_failure"])) - killed
    return figures


MODES = {
    "spare": "in-place, warm spare",
    "new": "in-place, new process",
    "restart": "restart (aioelastic)",
    "restart-plain": "restart, --fork-template off",
    "torchrun": "restart (torchrun)",
}
SHOWN = ("spare", "new", "restart", "restart-plain", "torchrun")
"""The order of the DDP tables' rows and columns."""
STAGES = ("detect", "announce", "form", "process group", "state transfer", "first collective")
DDP_STAGES = (
    "detect",
    "world formed",
    "process group",
    "state to fresh ranks",
    "DDP wrap",
    "next step",
    "caught up",
)


def median(runs: list[dict[str, float] | str], key: str) -> float | str:
    values = [r[key] for r in runs if isinstance(r, dict) and key in r]
    if not values:
        failures = [r for r in runs if isinstance(r, str)]
        return failures[0] if failures else "n/a"
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default=None,
        help="worker counts, comma-separated (default: 4 for ddp, 4,8,16 for allreduce)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure")
    parser.add_argument("--torchrun-sizes", default="4", help="sizes torchrun is run at")
    parser.add_argument("--modes", default=",".join(MODES), help="a subset of " + ", ".join(MODES))
    parser.add_argument(
        "--workload",
        choices=("ddp", "allreduce"),
        default="ddp",
        help="ddp: kill -> every rank's next optimizer step (default); allreduce: kill -> "
        "every rank's first all_reduce of the next world",
    )
    parser.add_argument(
        "--model",
        choices=tuple(DDP_SHAPE),
        default="mlp",
        help="the DDP workload's model: a small MLP, or one of about 100M parameters",
    )
    parser.add_argument(
        "--ddp-init-sync",
        choices=("always", "skip"),
        default="always",
        help="skip: DDP(model, init_sync=not handed.synced), no second copy of rank 0's module "
        "after worker.hand_over (default: always, as most scripts do)",
    )
    options = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("recovery benchmark: skipped (torch is not installed)")
        return
    default_sizes = "4" if options.workload == "ddp" else "4,8,16"
    sizes = [int(s) for s in (options.sizes or default_sizes).split(",")]
    torchrun_sizes = {int(s) for s in options.torchrun_sizes.split(",") if s}
    model = options.model if options.workload == "ddp" else None
    if model is None:
        what = "every rank's first all_reduce of the next world"
    else:
        what = f"every rank's next DDP optimizer step ({model} model"
        what += (
            ", DDP's init sync skipped after hand_over)" if options.ddp_init_sync == "skip" else ")"
        )
    print(
        f"recovery benchmark: kill -9 of one of N gloo workers -> {what}; median of "
        f"{options.repeat}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start "
        "(shared: noisy)"
    )
    with tempfile.TemporaryDirectory(prefix="aioelastic-bench-recovery-") as tmp:
        for nproc in sizes:
            chosen = options.modes.split(",")
            modes = [m for m in chosen if m != "torchrun" or nproc in torchrun_sizes]
            runs = {
                m: [
                    one_run(m, nproc, Path(tmp), model, options.ddp_init_sync)
                    for _ in range(options.repeat)
                ]
                for m in modes
            }
            if model is None:
                report(nproc, runs)
            else:
                report_ddp(nproc, runs, model)
            print(f"  load {os.getloadavg()[0]:.1f} at the end")


def report(nproc: int, runs: dict[str, list[dict[str, float] | str]]) -> None:
    """The all_reduce workload's tables."""
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


def model_bytes(model: str) -> int:
    """The bytes of the DDP workload's parameters (fp32), as ``_recovery_ddp_worker`` builds it."""
    width, hidden, layers = MODELS[model]
    sizes = [width] + [hidden] * (layers - 1) + [width]
    return 4 * sum(n_in * n_out + n_out for n_in, n_out in itertools.pairwise(sizes))


def loopback_rate(nbytes: int) -> float:
    """Bytes a second one TCP connection on loopback carries (the reference for the hand-over):
    ``nbytes`` from a thread to this one, through 4 MiB buffers."""
    listener = socket.create_server(("127.0.0.1", 0))
    chunk = bytearray(4 << 20)

    def send() -> None:
        with socket.create_connection(listener.getsockname()) as out:
            left = nbytes
            while left > 0:
                left -= out.send(memoryview(chunk)[: min(left, len(chunk))])

    sender = threading.Thread(target=send)
    start = time.perf_counter()
    sender.start()
    connection, _ = listener.accept()
    with connection, listener:
        received, into = 0, bytearray(4 << 20)
        while received < nbytes:
            got = connection.recv_into(into)
            if not got:
                break
            received += got
    sender.join()
    return received / (time.perf_counter() - start)


def _cell(value: float | str, scale: float = 1000.0, digits: int = 0) -> str:
    return f"{value * scale:.{digits}f}" if isinstance(value, float) else "n/a"


def report_ddp(nproc: int, runs: dict[str, list[dict[str, float] | str]], model: str) -> None:
    """The DDP workload's tables: the headline against torchrun, then the stages."""
    print()
    print(f"{nproc} workers, {model} model: kill -9 -> every rank's next optimizer step:")
    print(f"{'measure':40} {'next step':>10} {'caught up':>10} {'lost':>5} {'vs torchrun':>12}")
    theirs = median(runs.get("torchrun", ["not run"]), "caught up")
    for mode in SHOWN:
        if mode not in runs:
            continue
        ours = median(runs[mode], "caught up")
        label = f"{MODES[mode]} (s)"
        if isinstance(ours, str):
            print(f"{label:40} {'n/a':>10} ({ours})")
            continue
        ratio = f"{theirs / ours:11.1f}x" if isinstance(theirs, float) else f"{'n/a':>12}"
        nxt = median(runs[mode], "next step")
        lost = median(runs[mode], "lost steps")
        print(f"{label:40} {_cell(nxt, 1, 3):>10} {ours:10.3f} {_cell(lost, 1, 0):>5} {ratio}")
    print("  (caught up: every rank past the step the job had reached; lost: steps re-done)")
    print()
    print(f"{nproc} workers, {model} model: where the time goes (ms after the kill, last rank):")
    shown = [m for m in SHOWN if m in runs]
    print(f"{'stage':24}" + "".join(f" {m:>10}" for m in shown))
    for stage in DDP_STAGES:
        cells = [_cell(median(runs[mode], stage)) for mode in shown]
        print(f"{stage:24}" + "".join(f" {cell:>10}" for cell in cells))
    ours = median(runs.get("spare", ["not run"]), "next step")
    if isinstance(ours, float):
        print(f"  target with a spare: under 100 ms; measured {ours * 1000:.1f} ms")
    handed = median(runs.get("spare", ["not run"]), "hand-over")
    if isinstance(handed, float):
        size = model_bytes(model)
        reference = loopback_rate(max(size, 64 << 20))
        print(
            f"  hand-over of {size / 1e6:.1f} MB to the fresh rank (the last process group to the "
            f"fresh rank's state): {handed * 1000:.1f} ms, {size / handed / 1e9:.2f} GB/s; one "
            f"TCP connection on loopback now: {reference / 1e9:.2f} GB/s "
            f"({size / handed / reference:.2f}x of it)"
        )


if __name__ == "__main__":
    main()
