"""The launch soak: the same small gloo jobs launched again and again, by us and by torchrun.

A launcher is judged first by whether every job it is given runs. Each *cell* of the matrix is
one way to launch (standalone, a static pair of nodes, three c10d or etcd agents; restart or
in-place recovery, with a spare or without; torch's store straight from the job's store or
through a token-protected loopback relay; 1 or 4 workers; a clean job or one whose worker is
SIGKILLed once), run
``runs`` times in turn. A run is *ok* when every launcher exits 0 within the bound, and then no
process of the run is left (each run's processes carry a tag in their environment, so an orphan
is found wherever it went). Anything else is kept with its console: a failure here is a bug
report, not noise.

    python -m stress.launch_soak --runs 200 [--cells static,c10d] [--json out.json]

``make stress`` runs every cell 200 times (``SOAK_RUNS`` to change it) and fails on any run we
lose; the table goes into RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"
PLAIN = str(WORKERS / "soak_plain.py")
IN_PLACE = str(WORKERS / "soak_world.py")
BOUND = 120.0
"""Seconds a run may take before it counts as hung (a clean run takes a few)."""
AIOELASTIC = (sys.executable, "-m", "aioelastic", "run")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
TAG = "AIOELASTIC_SOAK_TAG"
TORCHRUNS = ("standalone", "static", "c10d")
"""Topologies torchrun has a cell of (its etcd backend speaks etcd's v2 API, not run here)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One way to launch the job."""

    launcher: str
    """``aioelastic`` or ``torchrun``."""
    topology: str
    """``standalone``, ``static`` (2 nodes), ``c10d`` or ``etcd`` (3 agents), or ``embedded``
    (the README's embedded rendezvous in 3 processes, closed by rank 0: no launcher, no worker)."""
    nproc: int = 1
    recovery: str = "restart"
    kill: bool = False
    token: bool = False
    warm: bool = False
    """The kill waits until each node's fork template learned what the workers load (its
    events file says ``TemplateLearned``): the restart forks from it."""
    spares: int = 0
    """``--spares`` of in-place recovery: a spare takes the killed rank's place."""

    @property
    def nodes(self) -> int:
        return {"standalone": 1, "static": 2}.get(self.topology, 3)

    @property
    def name(self) -> str:
        if self.topology == "embedded":
            return f"{self.launcher} embedded rendezvous 3 processes closed"
        parts = [self.launcher, self.topology, f"{self.nproc}w"]
        parts += [self.recovery] if self.kill else []
        parts += ["kill-9" if self.kill else "clean"]
        parts += ["token-relay"] if self.token else []
        parts += ["warm-template"] if self.warm else []
        parts += [f"{self.spares} spare"] if self.spares else []
        return " ".join(parts)


def matrix() -> list[Cell]:
    """Every cell: ours in each mode, torchrun's wherever torchrun has the mode."""
    ours = [
        Cell("aioelastic", "standalone", 1),
        Cell("aioelastic", "standalone", 4),
        Cell("aioelastic", "standalone", 4, kill=True),
        Cell("aioelastic", "standalone", 4, kill=True, warm=True),
        Cell("aioelastic", "standalone", 4, recovery="in-place", kill=True),
        Cell("aioelastic", "standalone", 4, recovery="in-place", kill=True, spares=1),
        Cell("aioelastic", "static", 1),
        Cell("aioelastic", "static", 4),
        Cell("aioelastic", "static", 1, token=True),
        Cell("aioelastic", "static", 1, kill=True),
        Cell("aioelastic", "c10d", 1),
        Cell("aioelastic", "c10d", 1, token=True),
        Cell("aioelastic", "c10d", 1, kill=True),
        Cell("aioelastic", "c10d", 1, recovery="in-place", kill=True),
        Cell("aioelastic", "etcd", 1),
        Cell("aioelastic", "etcd", 1, kill=True),
        Cell("aioelastic", "embedded"),
    ]
    theirs = [
        Cell("torchrun", cell.topology, cell.nproc, cell.recovery, cell.kill)
        for cell in ours
        if cell.recovery == "restart"
        and not (cell.token or cell.warm)
        and cell.topology in TORCHRUNS
    ]
    return ours + theirs


@dataclass(slots=True)
class Outcome:
    """How one run ended: ``ok``, ``failed``, ``aborted`` (SIGABRT), ``hung`` or ``orphans``."""

    verdict: str
    seconds: float
    console: str = ""


@dataclass(slots=True)
class Tally:
    """A cell's runs so far."""

    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(outcome.verdict == verdict for outcome in self.outcomes)

    @property
    def lost(self) -> int:
        return len(self.outcomes) - self.count("ok")

    def median(self) -> float:
        return statistics.median(o.seconds for o in self.outcomes) if self.outcomes else 0.0


def free_port() -> int:
    """A TCP port free on loopback right now (the kernel's pick, as the tests take theirs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def argv_for(cell: Cell, node: int, port: int, run_id: str, extra: Sequence[str]) -> list[str]:
    """The command line of node ``node`` of one run of ``cell``."""
    launcher = AIOELASTIC if cell.launcher == "aioelastic" else TORCHRUN
    argv = [*launcher, f"--nproc-per-node={cell.nproc}"]
    if cell.topology == "standalone":
        argv.append("--standalone")
    elif cell.topology == "static":
        argv += ["--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1"]
        argv.append(f"--master-port={port}")
    else:
        argv += [f"--nnodes={cell.nodes}", f"--rdzv-backend={cell.topology}"]
        argv += [f"--rdzv-id={run_id}", *extra]
    if cell.kill:
        argv.append("--max-restarts=1")
    if cell.warm:
        argv.append(f"--events-file=events-{run_id}-{node}.jsonl")
    if cell.spares:
        argv.append(f"--spares={cell.spares}")
    if cell.recovery == "in-place":
        argv += ["--recovery=in-place", IN_PLACE]
    else:
        argv.append(PLAIN)
    return argv


def tagged_pids(tag: str) -> list[int]:
    """Every process whose environment carries ``tag`` (a run's launchers and all they start)."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
    return found


def kill_all(tag: str) -> list[int]:
    """SIGKILL what is left of a run; return the pids that were left."""
    left = tagged_pids(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def run_once(cell: Cell, workdir: Path, etcd_endpoints: str | None = None) -> Outcome:
    """Launch one run of ``cell`` and judge it."""
    if cell.topology == "embedded":
        return embedded_once()
    tag = uuid.uuid4().hex
    port = free_port()
    extra: list[str] = []
    if cell.topology == "c10d":
        extra.append(f"--rdzv-endpoint=127.0.0.1:{port}")
    elif cell.topology == "etcd":
        if etcd_endpoints is None:
            raise ValueError("the etcd cells need --etcd ENDPOINTS (or make stress's etcd)")
        extra.append(f"--rdzv-endpoint={etcd_endpoints}")
    conf = ["last_call_timeout=1"] if cell.topology in ("c10d", "etcd") else []
    if cell.token:
        token = workdir / "token"
        token.write_text(uuid.uuid4().hex * 2)
        token.chmod(0o600)
        conf.append(f"token_file={token}")
    if conf and cell.launcher == "aioelastic":
        extra.append(f"--rdzv-conf={','.join(conf)}")
    elif cell.topology == "c10d":
        extra.append("--rdzv-conf=last_call_timeout=1")
    env = {**os.environ, TAG: tag, "SOAK_MARKER": str(workdir / f"killed-{tag}")}
    if cell.kill:
        env["SOAK_KILL"] = f"{cell.nodes * cell.nproc - 1}:2"
    if cell.warm:  # the victim is on the last node
        env["SOAK_WAIT_TEMPLATE"] = str(workdir / f"events-soak-{tag[:8]}-{cell.nodes - 1}.jsonl")
    logs = [workdir / f"node{node}.log" for node in range(cell.nodes)]
    started = time.monotonic()
    processes = []
    for node, log in enumerate(logs):
        with log.open("wb") as out:
            processes.append(
                subprocess.Popen(
                    argv_for(cell, node, port, f"soak-{tag[:8]}", extra),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=workdir,
                    start_new_session=True,
                )
            )
    hung = False
    for process in processes:
        try:
            process.wait(timeout=max(0.0, started + BOUND - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            break
    seconds = time.monotonic() - started
    left = kill_all(tag)
    for process in processes:
        process.wait()
    console = "\n".join(f"--- node {n}\n{log.read_text(errors='replace')}" for n, log in
                        enumerate(logs))  # fmt: skip
    codes = [process.returncode for process in processes]
    if hung:
        verdict = "hung"
    elif any(codes):
        verdict = "aborted" if re.search(r"SIGABRT|terminate called", console) else "failed"
    elif left:
        verdict = "orphans"
    else:
        verdict = "ok"
    return Outcome(verdict, seconds, console if verdict != "ok" else "")


def embedded_once() -> Outcome:
    """One run of the README's embedded rendezvous (see ``stress.embedded_rendezvous``)."""
    from stress.embedded_rendezvous import run_embedded_rendezvous

    started = time.monotonic()
    failures = run_embedded_rendezvous(1, 3, timeout=BOUND)
    seconds = time.monotonic() - started
    if not failures:
        return Outcome("ok", seconds)
    failure = failures[0]
    verdict = "hung" if "outlived" in failure.reason else "failed"
    return Outcome(verdict, seconds, "\n".join([failure.reason, *failure.outputs]))


@contextlib.contextmanager
def etcd_server(base: Path) -> Iterator[str]:
    """One etcd member on loopback for the etcd cells (Debian's ``etcd-server``)."""
    from aioelastic.testing._etcd import EtcdCluster, find_etcd_binary

    binary = find_etcd_binary()
    if binary is None:
        raise RuntimeError("the etcd cells need the etcd binary (apt-get install etcd-server)")
    with EtcdCluster(binary, base / "etcd") as cluster:
        yield cluster.endpoints


def soak(
    cells: Sequence[Cell],
    runs: int,
    *,
    etcd_endpoints: str | None = None,
    keep: Path | None = None,
    after_run: Callable[[dict[str, Tally]], None] | None = None,
) -> dict[str, Tally]:
    """Run every cell ``runs`` times in turn (cell by cell, so each run has the machine);
    ``after_run`` sees the tallies after each run (a soak of hours keeps what it found if it
    is stopped)."""
    tallies: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory(prefix="aioelastic-soak-") as scratch:
        for cell in cells:
            tally = tallies.setdefault(cell.name, Tally())
            for index in range(runs):
                workdir = Path(scratch) / f"{len(tallies)}-{index}"
                workdir.mkdir()
                outcome = run_once(cell, workdir, etcd_endpoints)
                tally.outcomes.append(outcome)
                if outcome.verdict != "ok" and keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    name = re.sub(r"\W+", "-", cell.name)
                    (keep / f"{name}-{index}-{outcome.verdict}.txt").write_text(outcome.console)
                if after_run is not None:
                    after_run(tallies)
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    """The soak's table (markdown), a row per cell."""
    rows = [
        "| cell | runs | ok | failed | SIGABRT | hung | orphans | median s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, tally in tallies.items():
        counts = [tally.count(v) for v in ("ok", "failed", "aborted", "hung", "orphans")]
        cells = " | ".join(str(c) for c in counts)
        rows.append(f"| {name} | {len(tally.outcomes)} | {cells} | {tally.median():.2f} |")
    return "\n".join(rows)


def write_counts(path: Path, tallies: dict[str, Tally]) -> None:
    """Write each cell's counts and median seconds so far to ``path`` (JSON)."""
    counts = {
        name: {
            **{v: t.count(v) for v in ("ok", "failed", "aborted", "hung", "orphans")},
            "median_seconds": round(t.median(), 2),
        }
        for name, t in tallies.items()
    }
    path.write_text(json.dumps(counts, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per cell")
    parser.add_argument("--cells", default="", help="only cells whose name has one of these words")
    parser.add_argument("--json", type=Path, help="keep every cell's counts here (after each run)")
    parser.add_argument("--keep", type=Path, help="write each lost run's consoles here")
    args = parser.parse_args(argv)
    words = [w for w in args.cells.split(",") if w]
    cells = [c for c in matrix() if not words or any(w in c.name for w in words)]
    with contextlib.ExitStack() as stack:
        endpoints = None
        if any(cell.topology == "etcd" for cell in cells):
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-etcd-")))
            endpoints = stack.enter_context(etcd_server(base))
        tallies = soak(
            cells,
            args.runs,
            etcd_endpoints=endpoints,
            keep=args.keep,
            after_run=None if args.json is None else partial(write_counts, args.json),
        )
    print(table(tallies))
    lost = sum(t.lost for name, t in tallies.items() if name.startswith("aioelastic"))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
