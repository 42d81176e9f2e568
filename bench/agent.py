"""Agent benchmarks: ``aioelastic run`` against ``torchrun`` on the same machine, same run.

* trivial job: wall time of a standalone job whose 2 workers exit at once, and the CPU time
  of its whole process tree (steadier than wall time on a loaded machine);
* failure to restart: from a worker's failing exit (its own timestamp) to its replacement's
  first line of Python (the replacement's timestamp), with 2 workers and one restart.

Run ``python -m bench.agent [--repeat N]``. torchrun is skipped when torch is not installed.
Figures are medians after one warm-up run of each launcher; on a shared machine they are
noisy. Launchers run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed), as for
any installed package: torch's wheel ships its bytecode, and an editable aioelastic would
otherwise recompile every module on every start.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TRIVIAL = "import os\n"

FAIL_ONCE = """\
import os, sys, time
now = time.time()
out = sys.argv[1]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if os.environ["LOCAL_RANK"] == "0":
    if attempt == "0":
        with open(out + ".failed", "w") as f:
            f.write(repr(time.time()))
        sys.exit(1)
    with open(out + ".restarted", "w") as f:
        f.write(repr(now))
"""

Launcher = Callable[[list[str]], list[str]]


def aioelastic_run(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "aioelastic", "run", *args]


def torchrun(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def children_cpu() -> float:
    """CPU seconds (user + system) of every waited-for descendant so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` to completion; return its wall time and the CPU time of its process tree."""
    env = {**os.environ, "LOGLEVEL": "ERROR"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cpu = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
    return elapsed, children_cpu() - cpu


def trivial_job(launcher: Launcher, script: Path) -> float:
    return run(launcher(["--standalone", "--nproc-per-node", "2", str(script)]))[0]


def trivial_job_cpu(launcher: Launcher, script: Path) -> float:
    """CPU time of the whole job (launcher and workers): steadier than wall time under load."""
    return run(launcher(["--standalone", "--nproc-per-node", "2", str(script)]))[1]


def failure_to_restart(launcher: Launcher, script: Path, workdir: Path) -> float:
    out = workdir / f"mark-{time.perf_counter_ns()}"
    run(
        launcher(
            ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script), str(out)]
        )
    )
    failed = float(Path(f"{out}.failed").read_text())
    restarted = float(Path(f"{out}.restarted").read_text())
    return restarted - failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement")
    repeat = parser.parse_args().repeat
    launchers: dict[str, Launcher] = {"aioelastic": aioelastic_run}
    if importlib.util.find_spec("torch") is not None:
        launchers["torchrun"] = torchrun
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        trivial = workdir / "trivial.py"
        trivial.write_text(TRIVIAL)
        fail_once = workdir / "fail_once.py"
        fail_once.write_text(FAIL_ONCE)
        rows: list[tuple[str, Callable[[Launcher], float]]] = [
            ("trivial 2-worker job, wall (s)", lambda cmd: trivial_job(cmd, trivial)),
            ("trivial 2-worker job, CPU (s)", lambda cmd: trivial_job_cpu(cmd, trivial)),
            ("failure to restart (s)", lambda cmd: failure_to_restart(cmd, fail_once, workdir)),
        ]
        print(f"agent benchmarks: median of {repeat} runs, {os.cpu_count()} CPUs (noisy if shared)")
        print(f"{'measure':34} {'aioelastic':>11} {'torchrun':>10} {'speed-up':>9}")
        for launcher in launchers.values():  # warm-up: bytecode and file caches
            trivial_job(launcher, trivial)
        for name, measure in rows:
            medians = {
                label: statistics.median(measure(launcher) for _ in range(repeat))
                for label, launcher in launchers.items()
            }
            ours = medians["aioelastic"]
            theirs = medians.get("torchrun")
            ratio = f"{theirs / ours:8.1f}x" if theirs else "      n/a"
            theirs_text = f"{theirs:10.3f}" if theirs else "       n/a"
            print(f"{name:34} {ours:11.3f} {theirs_text} {ratio}")


if __name__ == "__main__":
    main()
