"""One rank of a three-rank world for tests/worker/test_handover.py (no agent: a FileStore world).

``python handover.py DIR RANK [--fresh-without-optimizer] [--survivor-behind]``: ranks 0 and 1
survive (they trained a step with Adam and hold an RNG state of their own; both are at step 7,
or rank 1 at 6 with ``--survivor-behind``), rank 2 is fresh. Every rank
calls ``worker.hand_over`` and saves what it holds after it to ``DIR/<rank>.pt``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from aioelastic import worker
from aioelastic.worker._protocol import WorldAssigned


def main() -> None:
    out, rank = Path(sys.argv[1]), int(sys.argv[2])
    without_optimizer = "--fresh-without-optimizer" in sys.argv
    behind = "--survivor-behind" in sys.argv
    fresh = rank == 2
    store = {"kind": "file", "path": str(out / "store")}
    world = worker.World(WorldAssigned(2, rank, 3, rank, fresh, 0, (2,), store, 60.0), None)
    world.init_process_group("gloo")
    torch.manual_seed(100 + rank)  # every rank starts somewhere else
    random.seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    step, extra = 0, None
    if not fresh:  # a survivor trained: its module, optimizer state and step moved on
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        step = 6 if behind and rank == 1 else 7
        extra = {"tensor": torch.arange(3.0) + rank, "object": ("a", rank)}
    try:
        got = worker.hand_over(
            world,
            model,
            None if fresh and without_optimizer else optimizer,
            step=step,
            extra=extra,
        )
    except worker.HandOverError as exc:
        print(f"refused: {exc}", flush=True)
        raise SystemExit(3) from None
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": got.step,
        "extra": got.extra,
        "received": got.received,
        "synced": got.synced,
        "torch_rng": torch.get_rng_state(),
        "random": random.random(),
    }
    torch.save(state, out / f"{rank}.pt")


if __name__ == "__main__":
    main()
