"""A torch worker that never destroys its process group; says when something else does."""

import os

import torch
import torch.distributed as dist

original = dist.destroy_process_group


def destroy(*args: object, **kwargs: object) -> None:
    print(f"rank {os.environ['RANK']} destroyed at exit", flush=True)
    original(*args, **kwargs)  # type: ignore[arg-type]


dist.destroy_process_group = destroy
print(f"rank {os.environ['RANK']} master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {os.environ['RANK']} sum {value.item():g}", flush=True)
