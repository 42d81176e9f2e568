"""In-place recovery with torch: a failed rank is replaced, the others train on.

    aioelastic run --standalone --nproc-per-node 4 --recovery in-place --spares 1 \\
        examples/agent_inplace_torch.py

Each generation of the world gets its own store; a fresh rank (a spare or a replacement)
receives the model and the step from ``world.source_rank``. Kill a worker with ``kill -9``
while it runs: the survivors keep their processes and go on from where they were.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from aioelastic import worker
from aioelastic.errors import record

STEPS = 20


@record
def main() -> None:
    model = torch.nn.Linear(4, 1)
    step = torch.zeros(1, dtype=torch.int64)
    for world in worker.worlds():
        with world:
            world.init_process_group("gloo")
            if world.fresh_ranks:  # someone holds no state: the source rank sends its own
                for tensor in (*model.parameters(), step):
                    dist.broadcast(tensor.data, src=world.source_rank)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            while step.item() < STEPS:
                world.check()  # leave at a step boundary once the world changed
                loss = model(torch.ones(8, 4)).pow(2).mean()
                loss.backward()
                for param in model.parameters():  # average the gradients over this world
                    assert param.grad is not None
                    dist.all_reduce(param.grad)
                    param.grad /= world.world_size
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                time.sleep(0.05)  # a longer step, so there is time to kill a worker
            dist.barrier()
            print(f"rank {world.rank} of generation {world.generation}: finished at step {STEPS}")


if __name__ == "__main__":
    main()
