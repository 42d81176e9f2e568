"""In-place recovery with forked workers: each step is a matmul, a backward pass and a gloo
all_reduce; rank 2 kills itself once (``--marker`` remembers it) and its replacement (a fork
of the template, or a spare forked earlier) carries on with the survivors."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from aioelastic import worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--marker", type=Path, required=True)
    options = parser.parse_args()
    step = 0
    for world in worker.worlds():
        with world:
            world.init_process_group("gloo")
            print(
                f"gen {world.generation} rank {world.rank} pid {os.getpid()} "
                f"parent {os.getppid()} fresh {int(world.is_fresh)}",
                flush=True,
            )
            if world.fresh_ranks:
                box = torch.tensor([step], dtype=torch.int64)
                dist.broadcast(box, src=world.source_rank)
                step = int(box.item())
            while step < options.steps:
                world.check()
                if step == 3 and world.rank == 2 and not options.marker.exists():
                    options.marker.write_text("killed")
                    os.kill(os.getpid(), signal.SIGKILL)
                weights = torch.randn(128, 128, requires_grad=True)
                (torch.randn(256, 128) @ weights).square().mean().backward()
                assert weights.grad is not None
                total = torch.tensor([1.0])
                dist.all_reduce(total)
                print(f"gen {world.generation} rank {world.rank} step {step} sum {total.item()}")
                step += 1
            dist.barrier()
    print(f"done rank {os.environ['RANK']} step {step}", flush=True)


if __name__ == "__main__":
    main()
