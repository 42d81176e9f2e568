"""The README's embedded rendezvous, run as a user would: N processes, one of them hosting the
``c10d`` store, rank 0 closing, every process awaiting ``wait_round_invalidated()``.

:func:`run_embedded_rendezvous` runs it ``runs`` times and returns what went wrong; the launch
soak and ``make stress`` call it. A run fails when a process exits non-zero, writes anything to
stderr (a warning), outlives ``timeout``, or does not end as its ``ending`` says:

* ``"close"``: rank 0 closes; every process prints CLOSED within ``within`` seconds of its wait;
* ``"host-closes"``: the same, the store's host being the one that closes;
* ``"leave"``: every process leaves as soon as the round completed (nobody closes);
* ``"kill-host"``: the store's host is SIGKILLed once the round completed; every other process
  prints STORE_LOST within ``within`` seconds (the store's host was lost).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SNIPPET = """\
import sys, time
import anyio
from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

async def main(port: int, nodes: int, host: bool) -> None:
    conf = {"is_host": "true"} if host else {}
    params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "job", min_nodes=nodes,
                                  max_nodes=nodes, **conf)
    async with get_rendezvous_handler(params) as handler:
        print("entered", flush=True)
        info = await handler.next_rendezvous()
        print("complete", info.rank, flush=True)
        ending = sys.argv[4]
        if ending == "leave":
            return
        if (ending == "close" and info.rank == 0) or (ending == "host-closes" and host):
            await handler.set_closed()
        started = time.monotonic()
        verdict = await handler.wait_round_invalidated()
        print(verdict.reason.name, f"{time.monotonic() - started:.3f}", flush=True)

anyio.run(main, int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "host")
"""


@dataclass(frozen=True)
class EmbeddedFailure:
    """One run that went wrong: why, and what each process printed (stdout, then stderr)."""

    run: int
    nodes: int
    reason: str
    outputs: tuple[str, ...]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Process:
    """One process of a run: its stdout read as it comes (select, no polling), its stderr
    to a file."""

    def __init__(self, command: list[str], err: Path, env: dict[str, str]) -> None:
        self.err = err
        with err.open("wb") as stderr:
            self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=env)
        self.out = b""

    def read_until(self, text: str, until: float) -> bool:
        """Read stdout until ``text`` is in it; False if it ended or time ran out first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while text.encode() not in self.out:
            left = until - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return False
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            self.out += chunk
        return True

    def finish(self, until: float) -> None:
        """Read the rest of stdout and reap the process (raises TimeoutExpired at ``until``)."""
        self.read_until("\0", until)  # never printed: reads to the end or to the deadline
        self.proc.wait(timeout=max(until - time.monotonic(), 0.1))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def output(self) -> str:
        return self.out.decode(errors="replace") + self.err.read_text(errors="replace")


ENDINGS = ("close", "host-closes", "leave", "kill-host")


def _one_run(
    script: Path, workdir: Path, nodes: int, ending: str, timeout: float, within: float
) -> tuple[str | None, tuple[str, ...]]:
    """Run the snippet once; return why it failed (or None) and what each process printed.

    Process 0 hosts the store where the ending needs to know which one does; it starts first.
    """
    port = _free_port()
    until = time.monotonic() + timeout
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    named_host = ending in ("host-closes", "kill-host")
    procs: list[_Process] = []
    try:
        reason = None
        for index in range(nodes):
            role = "host" if named_host and index == 0 else "node"
            command = [sys.executable, str(script), str(port), str(nodes), role, ending]
            procs.append(_Process(command, workdir / f"err{index}", env))
            if role == "host" and not procs[0].read_until("entered", until):
                reason = "the store's host did not start"
                break
        if reason is None and ending == "kill-host":
            if not all(proc.read_until("complete", until) for proc in procs):
                reason = "the round did not complete"
            procs[0].proc.send_signal(signal.SIGKILL)
        if reason is None:
            for proc in procs:
                proc.finish(until)
            reason = _judge(procs, ending, within)
    except subprocess.TimeoutExpired:
        reason = f"a process outlived {timeout:g} s"
    finally:
        for proc in procs:
            proc.kill()
    return reason, tuple(proc.output() for proc in procs)


def _judge(procs: list[_Process], ending: str, within: float) -> str | None:
    """Why the finished run failed, or None."""
    want = {"kill-host": "STORE_LOST", "leave": "complete"}.get(ending, "CLOSED")
    for index, proc in enumerate(procs):
        if ending == "kill-host" and index == 0:
            continue  # killed
        if proc.proc.returncode != 0:
            return f"process {index} exited {proc.proc.returncode}"
        if proc.err.read_text(errors="replace").strip():
            return f"process {index} wrote to stderr"
        last = (proc.out.decode(errors="replace").splitlines() or [""])[-1].split()
        if len(last) != 2 or last[0] != want:
            return f"process {index} ended with {' '.join(last)!r}, not {want}"
        if ending != "leave" and float(last[1]) > within:
            return f"process {index} took {last[1]} s to see {want} (more than {within:g} s)"
    return None


def run_embedded_rendezvous(
    runs: int,
    nodes: int = 3,
    *,
    ending: str = "close",
    timeout: float = 120.0,
    within: float = 10.0,
) -> list[EmbeddedFailure]:
    """Run the embedded-rendezvous snippet ``runs`` times with ``nodes`` processes (this
    interpreter; ``PYTHONPATH`` decides which aioelastic), ending as ``ending`` says (see the
    module docstring), and return the failed runs (empty: all passed)."""
    if ending not in ENDINGS:
        raise ValueError(f"ending={ending!r} is not one of {', '.join(ENDINGS)}")
    failures = []
    with tempfile.TemporaryDirectory(prefix="embedded-rdzv-") as tmp:
        workdir = Path(tmp)
        script = workdir / "snippet.py"
        script.write_text(SNIPPET)
        for run in range(runs):
            reason, outputs = _one_run(script, workdir, nodes, ending, timeout, within)
            if reason is not None:
                failures.append(EmbeddedFailure(run, nodes, reason, outputs))
    return failures
