"""A torch worker for the in-place recovery tests: it trains in generations of the world.

Each rank contributes its pid to every step's all_reduce (float64: exact), so a test can check
that a generation's sum is exactly the sum of that generation's members' pids. The state (the
step count) survives in the survivors; a fresh rank receives it from ``world.source_rank``.
``--raise-at STEP`` makes rank 1 raise its own error once, ``--stop-at STEP`` makes rank 2 hang
(SIGSTOP) once (a marker file remembers it).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from aioelastic import worker
from aioelastic.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--stop-at", type=int, default=-1, help="rank 2 SIGSTOPs itself here")
    parser.add_argument("--marker", type=Path, default=Path("/nonexistent/dir/marker"))
    options = parser.parse_args()
    step = 0
    print(f"ready pid {os.getpid()}", flush=True)
    for world in worker.worlds():
        with world:
            world.init_process_group("gloo")
            print(
                f"gen {world.generation} rank {world.rank} of {world.world_size} "
                f"pid {os.getpid()} fresh {int(world.is_fresh)}",
                flush=True,
            )
            if world.fresh_ranks:
                box = torch.tensor([step], dtype=torch.int64)
                dist.broadcast(box, src=world.source_rank)
                step = int(box.item())
            while step < options.steps:
                world.check()
                if step == options.raise_at and world.rank == 1 and not options.marker.exists():
                    options.marker.write_text("raised")
                    raise ValueError(f"rank 1's own bug at step {step}")
                if step == options.stop_at and world.rank == 2 and not options.marker.exists():
                    options.marker.write_text("stopped")
                    os.kill(os.getpid(), signal.SIGSTOP)  # hangs, as if its host went silent
                total = torch.tensor([float(os.getpid())], dtype=torch.float64)
                dist.all_reduce(total)
                print(
                    f"gen {world.generation} rank {world.rank} step {step} sum {int(total.item())}",
                    flush=True,
                )
                step += 1
                time.sleep(options.step_time)  # the step's "compute"  # pace
            dist.barrier()
    print(f"done pid {os.getpid()} step {step}", flush=True)


if __name__ == "__main__":
    main()
