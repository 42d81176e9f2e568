"""Two ranks die at once: in generation 1, rank 1 kills rank 0, then itself.

The spare takes the first slot; the second death comes before that generation formed. Every
later generation meets in its store (each rank checks in, waits for all) and ends the job.
Torch is hidden (as in ``examples/worker_store_plain.py``): the world's store is then an
aioelastic one, on any machine.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.modules["torch"] = None  # type: ignore[assignment]  # as if torch were not installed

from aioelastic import worker  # noqa: E402

for world in worker.worlds():
    with world:
        store = world.store
        store.set(f"rank/{world.rank}", str(os.getpid()))
        if world.generation == 1:
            if world.rank == 1:
                os.kill(int(store.get("rank/0")), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # rank 0 waits for rank 1 to kill it
                time.sleep(1)  # pace
        store.wait([f"rank/{rank}" for rank in range(world.world_size)])
        print(f"gen {world.generation} rank {world.rank} pid {os.getpid()} all in", flush=True)
        break
