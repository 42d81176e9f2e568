"""``ddp_torchrun.py`` ported to in-place recovery: a fresh rank gets the state from a survivor.

    aioelastic run --standalone --nproc-per-node 2 --recovery in-place --spares 1 \\
        examples/ddp_inplace.py

When a worker dies, the survivors keep their processes and their state, a warm spare takes the
rank, and ``worker.hand_over`` sends it the model, the optimizer's state, the step and the RNG
states from a survivor: no checkpoint is loaded and no step is taken twice. The checkpoint is
still written, for a restart of the whole group (a node lost without a spare). Under torchrun
the script runs as ``ddp_torchrun.py`` does.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from aioelastic import worker

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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = resume(model, optimizer)  # a restart loads the last checkpoint on every rank
    for world in worker.worlds():
        with world:
            world.init_process_group("gloo")
            step = worker.hand_over(world, model, optimizer, step=step).step
            ddp = DDP(model)
            while step < STEPS:
                world.check()  # leave at a step boundary once the world changed
                train(ddp, optimizer, step, dist.get_rank())
                step += 1
                if step % 10 == 0 and dist.get_rank() == 0:
                    save(model, optimizer, step)
            if dist.get_rank() == 0 and len(sys.argv) > 1:  # where to leave the final weights
                torch.save(model.state_dict(), sys.argv[1])


if __name__ == "__main__":
    main()
