"""Real work in a forked worker: a parallel CPU matmul, a backward pass, a gloo all_reduce.

Rank 1 fails once after its work, so the restarted (forked again) group does it all again.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.set_num_threads(2)  # intra-op threads start in the child, after the fork
    weights = torch.randn(256, 256, requires_grad=True)
    loss = (torch.randn(512, 256) @ weights).square().mean()
    loss.backward()
    assert weights.grad is not None
    assert torch.isfinite(weights.grad).all()
    dist.init_process_group("gloo")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    sys.stdout.write(
        f"rank {rank} attempt {attempt} parent {os.getppid()}: grad ok, all_reduce {total.item()}\n"
    )
    if rank == 1 and attempt == 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
