"""``python -m bench`` (``make bench``): every benchmark in one run, then BENCHMARKS.md + chart.

Runs each ``bench/<part>.py`` as its own process (``python -m bench.<part>``, their own
defaults), keeps what it printed, and writes ``BENCHMARKS.md`` and ``bench/ratios.png`` (the
chart needs the ``timeline`` extra, matplotlib). ``--only`` picks benchmarks and keeps the others'
sections as the last report showed them (read back from it); ``--from-logs`` rebuilds the
report from earlier outputs saved in ``bench/logs/`` without re-running.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench._report import BenchRun, render_chart, render_markdown, runs_in

ROOT = Path(__file__).resolve().parent.parent
BENCHES = (
    "timer", "store", "rendezvous", "rendezvous_etcd", "agent", "recovery",
    "recovery_nodes", "preemption", "scale",
)  # fmt: skip
LOGS = ROOT / "bench" / "logs"
CHART = "bench/ratios.png"
NOTES = ROOT / "bench" / "notes"
"""Everything hand-written in BENCHMARKS.md: ``<bench>.md`` follows that benchmark's table (where
the time went), ``behind.md`` opens the list of where we are behind, and any other ``*.md`` is
a section of its own before that list (in name order). Edit these, never BENCHMARKS.md."""


def run_bench(name: str, timeout: float) -> BenchRun:
    """Run ``bench.<name>`` and keep its output (also saved under ``bench/logs/``)."""
    command = [sys.executable, "-m", f"bench.{name}"]
    print(f"running {' '.join(command[1:])} ...", file=sys.stderr, flush=True)
    when = f"{utc_now()}, load {os.getloadavg()[0]:.2f}"
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = -1
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else ""
        stderr = f"timed out after {timeout:g} s"
    run = BenchRun(
        name, " ".join(command[1:]), returncode, time.monotonic() - start, stdout, stderr, when
    )
    LOGS.mkdir(exist_ok=True)
    (LOGS / f"{name}.out").write_text(stdout)
    (LOGS / f"{name}.err").write_text(stderr)
    (LOGS / f"{name}.rc").write_text(f"{returncode} {run.seconds:.1f} {when}\n")
    print(stdout, end="", flush=True)
    return run


def load_bench(name: str) -> BenchRun | None:
    """A run saved earlier under ``bench/logs/`` (None if there is none)."""
    out = LOGS / f"{name}.out"
    if not out.exists():
        return None
    rc_file = LOGS / f"{name}.rc"
    rc_text = rc_file.read_text().split(maxsplit=2) if rc_file.exists() else []
    returncode, seconds = (int(rc_text[0]), float(rc_text[1])) if rc_text else (0, 0.0)
    when = rc_text[2].strip() if len(rc_text) > 2 else ""
    err = LOGS / f"{name}.err"
    return BenchRun(
        name,
        f"-m bench.{name}",
        returncode,
        seconds,
        out.read_text(),
        err.read_text() if err.exists() else "",
        when,
    )


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> list[tuple[str, str]]:
    """What the figures depend on: hardware, load, versions, date."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    etcd = shutil.which("etcd")
    etcd_version = "not found"
    if etcd:
        text = subprocess.run([etcd, "--version"], capture_output=True, text=True, check=False)
        etcd_version = (text.stdout.splitlines() or ["?"])[0]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        ("date", utc_now()),
        ("CPU", f"{cpu}, {os.cpu_count()} logical CPUs"),
        ("load average at start (1, 5, 15 min)", load),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("aioelastic", version("aioelastic")),
        ("torch", version("torch")),
        ("anyio", version("anyio")),
        ("uvloop", version("uvloop")),
        ("etcd", etcd_version),
    ]


def load_machine() -> list[tuple[str, str]]:
    """The machine facts saved with the logs (they describe the run, not the present)."""
    saved = LOGS / "machine.txt"
    if not saved.exists():
        return [("machine", "unknown (no bench/logs/machine.txt)")]
    pairs = (line.split("\t", 1) for line in saved.read_text().splitlines() if "\t" in line)
    return [(key, value) for key, value in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=BENCHES, default=list(BENCHES))
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    parser.add_argument("--from-logs", action="store_true", help="report on bench/logs/ only")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    facts = load_machine() if args.from_logs else machine()
    if not args.from_logs:
        LOGS.mkdir(exist_ok=True)
        (LOGS / "machine.txt").write_text("".join(f"{k}\t{v}\n" for k, v in facts))
    output = Path(args.output)
    # a partial run keeps the other benchmarks' sections of the last report, read back from it
    kept = runs_in(output.read_text()) if output.exists() else {}
    runs = []
    for name in BENCHES:
        if name not in args.only:
            run = kept.get(name)
        else:
            run = load_bench(name) if args.from_logs else run_bench(name, args.timeout)
        if run is not None:
            runs.append(run)
    figures = [figure for run in runs for figure in run.figures]
    chart = None
    if importlib.util.find_spec("matplotlib") is not None:
        chart = CHART if render_chart(figures, str(ROOT / CHART)) else None
    else:
        print("no chart: pip install 'aioelastic[timeline]' (matplotlib)", file=sys.stderr)
    notes = {path.stem: path.read_text() for path in sorted(NOTES.glob("*.md"))}
    closing = [text for name, text in notes.items() if name not in BENCHES and name != "behind"]
    output.write_text(render_markdown(runs, facts, chart, notes, closing))
    print(f"wrote {args.output}" + (f" and {CHART}" if chart else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
