"""A torch worker for ``aioelastic run``: every rank joins a gloo process group from the
environment the agent sets (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``) and
sums its rank with the others.

    aioelastic run --standalone --nproc-per-node 4 examples/agent_torch_allreduce.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from aioelastic.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")  # reads the env:// variables the agent set
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        expected = world * (world + 1) / 2
        if value.item() != expected:
            raise RuntimeError(f"all_reduce gave {value.item()}, expected {expected}")
        print(f"rank {rank}/{world} (local {os.environ['LOCAL_RANK']}): sum {value.item():g}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
