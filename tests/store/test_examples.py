"""The store examples and the README's Store snippet run and print what they promise."""

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


def test_readme_store_snippet_runs(tmp_path: Path) -> None:
    """The README's Store snippet runs and prints what it promises."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    snippet = readme.split("## Store", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, "1\nTrue\n"), result.stderr
