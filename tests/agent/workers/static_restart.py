"""Rank 1 dies right after joining the first attempt's gloo group while rank 0 is busy outside
any collective (so only the other node's restart can tell rank 0's node); the next attempt
all_reduces. Without a job-wide restart, rank 1's new worker reads rank 0's old address."""

import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"rank {rank} attempt {attempt} round {os.environ['AIOELASTIC_ROUND']}", flush=True)
if os.environ["AIOELASTIC_ROUND"] == "0":
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600)  # busy outside any collective: never learns its peer died
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {rank} sum {value.item():g}", flush=True)
