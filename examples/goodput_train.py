"""A training loop that marks its steps, so `aioelastic report` can say where the time went.

    aioelastic run --standalone --nproc-per-node 3 --max-restarts 1 --events-file events.jsonl \\
        examples/goodput_train.py /tmp/ckpt --crash-at 25 --slow-rank 2
    aioelastic report events.jsonl          # goodput, badput by cause, the straggler

Each step is marked (``world.step``), the rank's own work ends with ``world.work_done()`` (before
the step's all-reduce, so the slow rank is told from those it keeps waiting), and rank 0's
checkpoint saves are marked (``world.saving_checkpoint()``). ``--crash-at`` makes rank 1 kill
itself with SIGKILL at that step in the first generation of the world (the first attempt, or
under ``--recovery in-place`` the first world); ``--slow-rank`` works three times longer
per step. With torch the ranks all-reduce every step over gloo; without it they run the same
loop alone.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

from aioelastic import worker

STEP_SECONDS = 0.05


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--slow-rank", type=int, default=None)
    args = parser.parse_args()
    torch, dist = _torch()
    args.checkpoints.mkdir(parents=True, exist_ok=True)
    saved = args.checkpoints / "step"
    for world in worker.worlds():
        with world:
            if dist is not None:
                world.init_process_group("gloo")
            first = int(saved.read_text()) if saved.exists() else 0
            for step in range(first, args.steps):
                world.step(step)
                world.check()  # under --recovery in-place: leave a world that ended
                if world.generation == 1 and world.rank == 1 and step == args.crash_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                slow = 3 if world.rank == args.slow_rank else 1
                time.sleep(slow * STEP_SECONDS)  # stands for the forward and backward passes
                world.work_done()
                if dist is not None:
                    dist.all_reduce(torch.ones(4))
                if world.rank == 0 and step % 10 == 9:
                    with world.saving_checkpoint():
                        saved.write_text(str(step + 1))
    print(f"rank {os.environ['RANK']}: done", flush=True)


def _torch() -> tuple[Any, Any]:
    """torch and torch.distributed, or (None, None) where torch is not installed."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None, None
    return torch, dist


if __name__ == "__main__":
    main()
