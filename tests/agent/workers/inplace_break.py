"""The common mistake: ``break`` after ``with world:`` leaves the loop when a world ends.

Rank 1 of the first attempt kills itself (once: ``--marker FILE``) once rank 0 is inside
generation 1 (a rank that starts late meets generation 2 first and has no world end under it);
rank 0 then leaves ``worker.worlds()`` instead of taking its place in the next generation. The
attempt after the fallback ends at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from aioelastic import worker

parser = argparse.ArgumentParser()
parser.add_argument("--marker", type=Path, required=True)
options = parser.parse_args()
for world in worker.worlds():
    with world:
        print(f"gen {world.generation} rank {world.rank} pid {os.getpid()}", flush=True)
        if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
            break  # the job's second attempt: done
        if world.rank == 0:
            world.store.set("rank 0 is inside", "")
        if world.rank == 1 and not options.marker.exists():
            world.store.wait(["rank 0 is inside"])
            options.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            world.check()
            time.sleep(0.02)  # the step's "compute"  # pace
    break  # the mistake: also reached when the world ended under this rank
