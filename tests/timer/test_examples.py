"""The timer examples run as documented and show what they claim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_watchdog_example_reaps_the_hung_step() -> None:
    """The FIFO example's worker finishes two steps and is SIGKILLed in step 2."""
    out = run("timer_watchdog.py")
    assert "worker: step 1 done" in out
    assert "worker: step 2 done" not in out
    assert "reaped with signal 9 ('step-2')" in out
    assert "worker exit code: -9" in out


def test_tasks_example_cancels_only_the_hung_task() -> None:
    """The in-process example cancels the hung task and lets the quick one finish."""
    out = run("timer_tasks.py")
    assert "quick: done" in out
    assert "hung: scope 'hung' did not finish within 0.2 s" in out
