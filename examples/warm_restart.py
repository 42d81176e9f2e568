"""A restart that forks from a warm template: ``aioelastic run`` (``--fork-template auto``).

    aioelastic run --standalone --nproc-per-node 2 --max-restarts 1 \\
        --events-file events.jsonl examples/warm_restart.py events.jsonl

The first workers start plainly and import torch. While they run, the agent learns that they
loaded it (the installed packages a worker's process has mapped) and a fork template imports
it once. Rank 1 then fails, once: the restarted workers are forks of the template, so torch is
already imported before their first line runs. Run directly, this file launches itself that
way (with uvloop, another installed package with compiled code, where torch is not installed)
and prints what the workers said.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = "torch" if importlib.util.find_spec("torch") else "uvloop"
ALREADY_IMPORTED = HEAVY in sys.modules  # True in a fork of the template


def template_learned(events: Path) -> bool:
    """Whether the agent's events file says the template imported what the workers load."""
    if not events.exists():
        return False
    lines = events.read_text().splitlines()
    return any(json.loads(line)["kind"] == "TemplateLearned" for line in lines if line)


def worker(events: Path) -> None:
    importlib.import_module(HEAVY)  # free in a fork of the warm template
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    line = (
        f"restart {restart} rank {os.environ['RANK']}: {HEAVY} already imported="
        f"{ALREADY_IMPORTED} parent={os.getppid()}\n"
    )
    sys.stdout.write(line)  # one write: the ranks share the terminal (print writes the end apart)
    sys.stdout.flush()
    if restart == 0 and os.environ["RANK"] == "1":
        while not template_learned(events):  # a job runs a while before something fails
            time.sleep(0.1)
        sys.exit(1)


def launch() -> str:
    """Run this file as the workers of a 2-worker job that restarts once; their output."""
    with tempfile.TemporaryDirectory() as tmp:
        events = str(Path(tmp) / "events.jsonl")
        command = [sys.executable, "-m", "aioelastic", "run", "--standalone"]
        command += ["--nproc-per-node", "2", "--max-restarts", "1", "--events-file", events]
        done = subprocess.run(
            [*command, __file__, events], capture_output=True, text=True, check=True, timeout=120
        )
    return done.stdout + done.stderr


if __name__ == "__main__":
    if "RANK" in os.environ:
        worker(Path(sys.argv[1]))
    else:
        print(launch())
