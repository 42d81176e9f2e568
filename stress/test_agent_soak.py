"""Stress: one `aioelastic run` through 500 worker failures and 100 watchdog reaps.

The worker fails (exit 1) on most attempts and hangs under a 0.2 s watchdog timer on every
sixth, so the agent restarts the group 600 times. The agent's open descriptors and resident
memory are sampled at each of 30 early and the last 20 restarts (the least of each window is
compared, so a descriptor of a spawn in flight is not counted as growth); every worker's pid is
recorded and must be gone at the end. The early window opens after the first reap: its stack
capture is the loop's first subprocess (py-spy), and uvloop keeps the ``/dev/null`` it opens
for that one for the loop's life, a descriptor that is not growth.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from stress.conftest import Figures

FAILURES = 500
REAPS = 100
RESTARTS = FAILURES + REAPS
EARLY = range(7, 37)  # after the first reap (attempt 5, so restart 6)
WORKER = """
import os, sys, threading
from aioelastic import timer
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
if attempt == int(sys.argv[2]):
    sys.exit(0)
if attempt % 6 == 5:
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=0.2, scope="hang"):
        threading.Event().wait()
sys.exit(1)
"""


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


def sample(pid: int) -> tuple[int, int]:
    """Open descriptors and resident memory (KiB) of ``pid``."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return fds, rss


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().split(b") ")[-1][:1] != b"Z"
    except FileNotFoundError:
        return False


@pytest.mark.anyio
@pytest.mark.timeout(1800)
async def test_six_hundred_restarts(tmp_path: Path, figures: Figures) -> None:
    """600 restarts (500 failures, 100 reaps): all performed, no fd growth, no orphan."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [sys.executable, "-m", "aioelastic", "run", "--standalone"]
    command += ["--max-restarts", str(RESTARTS), str(script), str(pids), str(RESTARTS)]
    samples: dict[int, tuple[int, int]] = {}
    restarts = reaps = 0
    async with await anyio.open_process(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as agent:
        assert agent.stderr is not None
        buffer = b""
        with anyio.fail_after(1700):
            async for chunk in agent.stderr:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if b"restarting the worker group" in line:
                        restarts += 1
                        if restarts in EARLY or restarts > RESTARTS - 20:
                            samples[restarts] = sample(agent.pid)
                    elif b"watchdog: timer" in line:
                        reaps += 1
            status = await agent.wait()
    leftovers = [int(p) for p in os.listdir(pids) if alive(int(p))]
    started = len(os.listdir(pids))
    early = [samples[r] for r in samples if r in EARLY]
    late = [samples[r] for r in samples if r > RESTARTS - 20]
    fds_start, fds_end = min(f for f, _ in early), min(f for f, _ in late)
    rss_start, rss_end = min(m for _, m in early), min(m for _, m in late)
    figures["exit status"] = status
    figures["restarts performed"] = restarts
    figures["watchdog reaps reported"] = reaps
    figures["workers started"] = started
    figures["agent fds, least over restarts 7-36 / last 20"] = (fds_start, fds_end)
    figures["agent RSS KiB, least over restarts 7-36 / last 20"] = (rss_start, rss_end)
    figures["orphaned processes"] = len(leftovers)
    assert status == 0
    assert (restarts, reaps) == (RESTARTS, REAPS)
    assert leftovers == []
    assert fds_end <= fds_start
