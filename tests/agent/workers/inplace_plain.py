"""A worker without torch for the in-place recovery tests: steps are ``world.check()`` calls.

``--hang-once FILE``: a process that finds FILE takes it (renames it away) and hangs before it
asks for a world, so exactly one process hangs. ``--exit-when FILE``: stop stepping once FILE
exists (the test creates it), so a run ends when the test says.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from aioelastic import worker
from aioelastic.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang-once", type=Path)
    parser.add_argument("--exit-when", type=Path, required=True)
    options = parser.parse_args()
    if options.hang_once is not None:
        try:
            options.hang_once.rename(options.hang_once.with_suffix(".taken"))
        except FileNotFoundError:
            pass
        else:
            print(f"hanging pid {os.getpid()}", flush=True)
            threading.Event().wait()
    print(f"asking pid {os.getpid()}", flush=True)
    for world in worker.worlds():
        with world:
            print(
                f"gen {world.generation} rank {world.rank} pid {os.getpid()} "
                f"size {world.world_size}",
                flush=True,
            )
            while not options.exit_when.exists():
                world.check()
                time.sleep(0.02)  # the step's "compute"  # pace
    print(f"done pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
