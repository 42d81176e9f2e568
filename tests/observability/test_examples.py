"""The observability example runs as documented and shows what it claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aioelastic.events import read_event_log

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_cluster_example_survives_a_crash_and_logs_it(tmp_path: Path) -> None:
    """Three simulated nodes, one crashed: the two survivors succeed without a restart."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "observability_cluster.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,  # generous: six real worker processes on a loaded machine
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("survivor: succeeded, restarts 0") == 2
    kinds = [e.kind for e in read_event_log(tmp_path / "events.jsonl")]
    assert kinds.count("NodeLost") == 1
    assert kinds.count("RunFinished") == 2
