"""In-place recovery across nodes: a node lost -> a smaller world; a node joining -> a larger one.

Three ``aioelastic run --recovery in-place`` agents on loopback (``--nnodes 2:3``, c10d over a
store served by its own process), one plain worker each (``tests/agent/workers/
inplace_plain.py``, which prints every world it enters). Figures, per run:

* *lost*: ``kill -9`` of one agent -> both survivors' workers (the same processes) printed
  their world of 2: the rendezvous' ``heartbeat_timeout`` plus ``last_call_timeout`` bound it;
* *joined*: a fourth agent started -> all three workers printed their world of 3 (the agent's
  start, its rendezvous, its worker's start and imports, and the next generation);
* *silent (gloo)*: with gloo workers (``inplace_torch.py``) all_reducing every 50 ms, one
  agent and its worker are SIGSTOPped (a node that goes silent, as behind a partition: nothing
  is reset) -> both survivors printed their world of 2 (their process group formed). With the
  workers' abort they leave the collective in their processes; with it turned off
  (``AIOELASTIC_WORKER_ABORT=0``) their agents restart them. Before the abort, a survivor left
  only at its process group's timeout (half of ``--recovery-timeout``: 30 s by default).

``python -m bench.recovery_nodes [--heartbeat 3] [--last-call 0.5] [--repeat 3]
[--gloo-repeat 1]``; wall clock of one machine; the machine is shared, so figures are noisy.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "agent" / "workers" / "inplace_plain.py")
TORCH_WORKER = str(ROOT / "tests" / "agent" / "workers" / "inplace_torch.py")
PLAIN_LINE = rb"pid (?P<pid>\d+) size (?P<size>\d+)"
TORCH_LINE = rb"gen \d+ rank \d+ of (?P<size>\d+) pid (?P<pid>\d+)"
BOUND = 120.0
"""Seconds a stage may take before the run counts as not recovered."""


class Agent:
    """One agent process; a thread notes when its worker entered a world of each size."""

    def __init__(self, argv: list[str], env: dict[str, str], line: bytes = PLAIN_LINE) -> None:
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self.line = re.compile(line)
        self.worlds: list[tuple[float, int, int]] = []  # (when, size, pid)
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            found = self.line.search(line)
            if found:
                with self.changed:
                    when = time.monotonic()
                    self.worlds.append((when, int(found["size"]), int(found["pid"])))
                    self.changed.notify_all()

    def in_world(self, size: int, after: float) -> tuple[float, int]:
        """When (and as which pid) this agent's worker entered a world of ``size`` after
        ``after``; waits for it."""
        with self.changed:
            if not self.changed.wait_for(
                lambda: any(t > after and s == size for t, s, _ in self.worlds), timeout=BOUND
            ):
                raise TimeoutError(f"no world of {size} within {BOUND:g} s")
            return next((t, p) for t, s, p in self.worlds if t > after and s == size)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(heartbeat: float, last_call: float) -> tuple[float, float]:
    port, finish = free_port(), Path(tempfile.mkdtemp()) / "finish"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    python = [sys.executable, "-m", "aioelastic"]
    store = subprocess.Popen(
        [*python, "store-server", "--port", str(port)], stdout=subprocess.PIPE, env=env
    )
    agents: list[Agent] = []
    try:
        assert store.stdout is not None
        store.stdout.readline()  # "listening ..."
        conf = (
            f"heartbeat_timeout={heartbeat:g},keep_alive_interval=0.5,"
            f"last_call_timeout={last_call:g}"
        )
        argv = [
            *python, "run", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", "--rdzv-conf", conf,
            "--recovery", "in-place", WORKER, "--exit-when", str(finish),
        ]  # fmt: skip
        agents = [Agent(argv, env) for _ in range(3)]
        for agent in agents:
            agent.in_world(3, 0.0)
        before = {agent.in_world(3, 0.0)[1] for agent in agents[:2]}
        killed = time.monotonic()
        agents[2].process.kill()
        survivors = [agent.in_world(2, killed) for agent in agents[:2]]
        if {pid for _, pid in survivors} != before:
            raise AssertionError("the survivors' workers were restarted")
        lost = max(t for t, _ in survivors) - killed
        started = time.monotonic()
        agents.append(Agent(argv, env))
        joined = max(agents[i].in_world(3, started)[0] for i in (0, 1, 3)) - started
        finish.touch()
        for agent in (agents[0], agents[1], agents[3]):
            agent.process.wait(BOUND)
        return lost, joined
    finally:
        for agent in agents:
            agent.process.kill()
            agent.process.wait()
        store.kill()
        store.wait()


def silent_run(heartbeat: float, last_call: float, *, abort: bool) -> tuple[float, bool]:
    """A node goes silent under gloo workers: seconds until both survivors formed their world
    of 2, and whether they are the same processes."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not abort:
        env["AIOELASTIC_WORKER_ABORT"] = "0"
    python = [sys.executable, "-m", "aioelastic"]
    store = subprocess.Popen(
        [*python, "store-server", "--port", str(port)], stdout=subprocess.PIPE, env=env
    )
    agents: list[Agent] = []
    stopped: list[int] = []
    try:
        assert store.stdout is not None
        store.stdout.readline()  # "listening ..."
        conf = (
            f"heartbeat_timeout={heartbeat:g},keep_alive_interval=0.5,"
            f"last_call_timeout={max(last_call, 3.0):g}"  # wait for all three torch workers
        )
        argv = [
            *python, "run", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", "--rdzv-conf", conf,
            "--recovery", "in-place", TORCH_WORKER, "--steps", "1000000",
        ]  # fmt: skip
        agents = [Agent(argv, env, TORCH_LINE) for _ in range(3)]
        first = [agent.in_world(3, 0.0)[1] for agent in agents]
        time.sleep(1.0)  # a few steps of training in the world of 3
        stopped = [agents[2].process.pid, first[2]]
        silent = time.monotonic()
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        survivors = [agent.in_world(2, silent) for agent in agents[:2]]
        took = max(t for t, _ in survivors) - silent
        return took, {pid for _, pid in survivors} == set(first[:2])
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGKILL)
        for agent in agents:
            agent.process.kill()
            agent.process.wait()
        store.kill()
        store.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heartbeat", type=float, default=3.0)
    parser.add_argument("--last-call", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gloo-repeat", type=int, default=1)
    options = parser.parse_args()
    runs = [one_run(options.heartbeat, options.last_call) for _ in range(options.repeat)]
    load = os.getloadavg()[0]
    print(
        f"in-place across 3 nodes (heartbeat_timeout={options.heartbeat:g}, "
        f"last_call_timeout={options.last_call:g}, load {load:.1f}), median of {len(runs)}:"
    )
    print(
        f"  node lost  -> survivors in a world of 2: {statistics.median(r[0] for r in runs):.2f} s"
    )
    print(
        f"  node joins -> everyone in a world of 3:  {statistics.median(r[1] for r in runs):.2f} s"
    )
    if options.gloo_repeat < 1:
        return
    for abort in (True, False):
        silent = [
            silent_run(options.heartbeat, options.last_call, abort=abort)
            for _ in range(options.gloo_repeat)
        ]
        how = "abort" if abort else "no abort (AIOELASTIC_WORKER_ABORT=0)"
        kept = "same processes" if all(same for _, same in silent) else "restarted"
        print(
            f"  node silent, gloo, {how} -> survivors in a world of 2: "
            f"{statistics.median(t for t, _ in silent):.2f} s ({kept}; load "
            f"{os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
