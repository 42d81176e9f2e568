"""A DistributedDataParallel script for torchrun: a restart goes on from the last checkpoint.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 examples/ddp_torchrun.py

Its in-place port is ``ddp_inplace.py`` (the diff is in docs/guides/in-place-ddp.md).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 40
CHECKPOINT = "checkpoint.pt"


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data for ``step`` (the same whenever the step is taken)."""
    inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + rank))
    return inputs, inputs.sum(dim=1, keepdim=True)


def train(ddp: DDP, optimizer: torch.optim.Optimizer, step: int, rank: int) -> None:
    inputs, targets = batch(step, rank)
    loss = (ddp(inputs) - targets).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    torch.save(state, CHECKPOINT + ".new")
    os.replace(CHECKPOINT + ".new", CHECKPOINT)


def resume(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the last checkpoint, if there is one; the step to go on from."""
    if not os.path.exists(CHECKPOINT):
        return 0
    saved = torch.load(CHECKPOINT)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["step"])


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    dist.init_process_group("gloo")
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    step = resume(model, optimizer)  # a restart loads the last checkpoint on every rank
    while step < STEPS:
        train(ddp, optimizer, step, dist.get_rank())
        step += 1
        if step % 10 == 0 and dist.get_rank() == 0:
            save(model, optimizer, step)
    if dist.get_rank() == 0 and len(sys.argv) > 1:  # where to leave the final weights
        torch.save(model.state_dict(), sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
