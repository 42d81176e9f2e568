"""The launch soak's in-place worker: the same steps on ``worker.worlds()``. ``SOAK_KILL=RANK:STEP``
makes that rank of the first generation SIGKILL itself once (``SOAK_MARKER`` remembers it)."""

import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from aioelastic import worker

STEPS = 5
victim, _, at = os.environ.get("SOAK_KILL", "-1:-1").partition(":")
marker = Path(os.environ["SOAK_MARKER"])
for world in worker.worlds():
    with world:
        world.init_process_group("gloo")
        value = torch.ones(1)
        for step in range(STEPS):
            if world.rank == int(victim) and step == int(at) and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            value.fill_(1.0)
            dist.all_reduce(value)
            assert value.item() == world.world_size, (value.item(), world.world_size)
            world.check()
        print(f"soak rank {world.rank}/{world.world_size} done", flush=True)
        break
