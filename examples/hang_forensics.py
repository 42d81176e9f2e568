"""A torch job where one rank hangs: the agent's report names it and where it is stuck.

Every rank joins a gloo group and runs one step under the shared watchdog scope ``step``; the
last rank sleeps in ``load_batch`` while the others wait for it in ``all_reduce``. When the
timers expire the agent captures every rank's stacks before reaping, and says:
"rank 2 stuck in hang_forensics.py:NN load_batch; ranks 0 and 1 waiting in all_reduce".
The restarted group (``--max-restarts 1``) does not hang and finishes.

    aioelastic run --standalone --nproc-per-node 3 --max-restarts 1 --log-dir logs \\
        examples/hang_forensics.py
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from aioelastic import timer
from aioelastic.errors import record

STEP_BUDGET = float(os.environ.get("STEP_BUDGET", "3"))


def load_batch() -> torch.Tensor:
    time.sleep(3600)  # the bug: a data loader that never returns
    return torch.ones(1)


@record
def main() -> None:
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        hangs = rank == world - 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
        dist.all_reduce(torch.zeros(1))  # every rank is up: the step starts together
        with timer.expires(after=STEP_BUDGET, scope="step"):
            batch = load_batch() if hangs else torch.ones(1)
            dist.all_reduce(batch)
        print(f"rank {rank}: step done, sum {batch.item():g}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
