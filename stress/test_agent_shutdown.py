"""Stress: SIGTERM, SIGINT and SIGKILL to `aioelastic run` at several points of its life.

Each worker starts a grandchild (``sleep``) and records both pids; after the agent is gone the
test counts which of them are still alive a generous while later, and every other process
started under the trial's environment marker (the agent's guardian). Nothing may be left
behind, whatever the signal: on SIGKILL the workers die through the parent-death signal and
the grandchildren through the agent's guardian, which then exits.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from stress.conftest import Figures

POINTS = ("early", "spawn", "running", "restart")
"""Right after start, as the agent reports its workers started, once both run, at a restart."""
TRIALS_PER_SIGNAL = 24
WORKER = """
import os, subprocess, sys, time
out = sys.argv[1]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
child = subprocess.Popen(["sleep", "3600"])
with open(os.path.join(out, f"{os.getpid()}.{child.pid}"), "w"):
    pass
print("ready", flush=True)
if attempt == "0" and os.environ["LOCAL_RANK"] == "0" and sys.argv[2] == "restart":
    sys.exit(1)
time.sleep(3600)
"""


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().split(b") ")[-1][:1] != b"Z"


async def wait_gone(pids: list[int], bound: float) -> list[int]:
    """The pids still alive after ``bound`` seconds (checked each time one of them exits)."""
    with anyio.move_on_after(bound):
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                await anyio.wait_readable(fd)
            finally:
                os.close(fd)
    return [pid for pid in pids if alive(pid)]


def marked(marker: str) -> list[int]:
    """Every live process whose environment holds ``marker`` (all a trial's processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:  # exited meanwhile, or not ours
                continue
            if marker.encode() in environ:
                found.append(int(entry))
    return found


async def one_trial(tmp: Path, signum: signal.Signals, point: str) -> tuple[int, int, int]:
    """Run the agent, signal it at ``point``; return (workers, grandchildren, others) left."""
    trial = str(uuid.uuid4())
    out = tmp / f"{signum}-{point}-{random.random()}"
    out.mkdir()
    script = tmp / "worker.py"
    script.write_text(WORKER)
    mode = "restart" if point == "restart" else "stay"
    command = [sys.executable, "-m", "aioelastic", "run", "--standalone"]
    command += ["--nproc-per-node", "2", "--max-restarts", "3", "--shutdown-timeout", "5"]
    command += [str(script), str(out), mode]
    env = {**os.environ, "AIOELASTIC_SHUTDOWN_TRIAL": trial}  # inherited by all it starts
    agent = await anyio.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    try:
        assert agent.stdout is not None
        seen = b""
        wants = {"early": b"", "spawn": b"started", "running": b"ready", "restart": b"restarting"}
        want = wants[point]
        readies = 0
        with anyio.fail_after(120):
            while want and (want not in seen or (point == "running" and readies < 2)):
                seen += await agent.stdout.receive()
                readies = seen.count(b"ready")
        agent.send_signal(signum)
        with anyio.fail_after(120):
            await agent.wait()
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        await agent.aclose()
    pairs = [name.split(".") for name in os.listdir(out)]
    known = {int(pid) for pair in pairs for pid in pair}
    workers = await wait_gone([int(w) for w, _ in pairs], 30)
    children = await wait_gone([int(c) for _, c in pairs], 30)
    others: set[int] = set()
    while found := [p for p in marked(f"AIOELASTIC_SHUTDOWN_TRIAL={trial}") if p not in known]:
        # Until a scan finds none: a process found may start others before it exits.
        left = await wait_gone(found, 30)
        others.update(left)
        known.update(found)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    for pid in workers + children:
        os.kill(pid, signal.SIGKILL)
    return len(workers), len(children), len(others)


@pytest.mark.anyio
@pytest.mark.timeout(900)
async def test_agent_signals_leave_nothing_behind(tmp_path: Path, figures: Figures) -> None:
    """SIGTERM, SIGINT and SIGKILL to the agent leave no worker, grandchild or guardian."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Run as a background job of a non-interactive shell: the agents would inherit SIGINT
        # ignored and lose one sent before they install their handlers ("early" trials).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    left: dict[str, Counter[str]] = {}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        counts = left.setdefault(signum.name, Counter())
        for trial in range(TRIALS_PER_SIGNAL):
            point = POINTS[trial % len(POINTS)]
            workers, children, others = await one_trial(tmp_path, signum, point)
            counts["trials"] += 1
            counts[f"at {point}"] += 1
            counts["workers left"] += workers
            counts["grandchildren left"] += children
            counts["others left (guardian)"] += others
    figures["by signal"] = {name: dict(c) for name, c in left.items()}
    for counts in left.values():
        assert sum(v for k, v in counts.items() if k.endswith("left")) == 0, left
