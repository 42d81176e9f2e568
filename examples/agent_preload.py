"""Workers forked from a warm template: ``aioelastic run --preload``.

    aioelastic run --standalone --nproc-per-node 2 --preload torch examples/agent_preload.py

The agent starts one template per node that imports ``torch`` once; every worker (at the start,
after a restart, as an in-place replacement or a spare) is a fork of it, so it finds torch
already imported and starts in milliseconds. Each worker says whether its heavy module was
there before its first line ran, who its parent is, and draws a number (each rank its own
stream). Run directly, this file launches itself that way (preloading ``decimal`` where torch
is not installed) and prints what the workers said.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys

HEAVY = "torch" if importlib.util.find_spec("torch") else "decimal"
ALREADY_IMPORTED = HEAVY in sys.modules  # True in a fork of the template


def worker() -> None:
    importlib.import_module(HEAVY)  # free when preloaded
    print(
        f"rank {os.environ['RANK']}: {HEAVY} preloaded={ALREADY_IMPORTED} "
        f"parent={os.getppid()} draw={random.random():.6f}",
        flush=True,
    )


def launch() -> str:
    """Run this file as the workers of a 2-worker job with ``--preload``; their output."""
    command = [sys.executable, "-m", "aioelastic", "run", "--standalone", "--nproc-per-node"]
    command += ["2", "--preload", HEAVY, __file__]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    return done.stdout + done.stderr


if __name__ == "__main__":
    if "RANK" in os.environ:
        worker()
    else:
        print(launch())
