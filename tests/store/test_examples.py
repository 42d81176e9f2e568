"""The store examples run and print what they promise (the docs' snippets: tests/docs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(name: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_tcp_example_elects_one_leader() -> None:
    """Four clients pass the barrier and all see the same leader."""
    lines = run("store_tcp.py").splitlines()
    joined = [line for line in lines if "joined as" in line]
    assert len(joined) == 4
    assert len({line.split("leader is ")[1] for line in joined}) == 1


def test_watch_example_sees_the_heartbeat_expire() -> None:
    """The watcher wakes when the TTL key expires and the permanent key remains."""
    output = run("store_watch.py")
    assert "after the change: ['nodes/b']" in output
