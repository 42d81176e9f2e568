"""A worker that prints what its environment says of its ranks, before and in each world.

Rank 1 of the first generation kills itself, so a spare takes its place; every worker steps
with ``world.check()`` until ``--exit-when`` exists.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from aioelastic import worker


def env() -> str:
    names = ("RANK", "LOCAL_RANK", "ROLE_RANK", "AIOELASTIC_SPARE")
    return " ".join(f"{name}={os.environ.get(name, '-')}" for name in names)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-when", type=Path, required=True)
    options = parser.parse_args()
    print(f"asking pid {os.getpid()} {env()}", flush=True)
    for world in worker.worlds():
        with world:
            print(f"gen {world.generation} rank {world.rank} pid {os.getpid()} {env()}", flush=True)
            if world.generation == 1 and world.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            while not options.exit_when.exists():
                world.check()
                time.sleep(0.02)  # a step of an idle worker  # pace


if __name__ == "__main__":
    main()
