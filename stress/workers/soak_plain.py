"""The launch soak's plain torch worker: gloo over env://, a few all_reduces, then the end of the
script without ``destroy_process_group()`` (as most scripts end). ``SOAK_KILL=RANK:STEP``: that
rank SIGKILLs itself at that step of the job's first attempt; with ``SOAK_WAIT_TEMPLATE=EVENTS``
only once the agent's events file says its fork template learned what the workers load."""

import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

STEPS = 5
victim, _, at = os.environ.get("SOAK_KILL", "-1:-1").partition(":")
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.ones(1)
for step in range(STEPS):
    if first_attempt and rank == int(victim) and step == int(at):
        events = Path(os.environ.get("SOAK_WAIT_TEMPLATE", "/nonexistent"))
        while "SOAK_WAIT_TEMPLATE" in os.environ and "TemplateLearned" not in (
            events.read_text() if events.exists() else ""
        ):
            time.sleep(0.2)  # a job runs a while before it fails
        os.kill(os.getpid(), signal.SIGKILL)
    value.fill_(1.0)
    dist.all_reduce(value)
    assert value.item() == world, (value.item(), world)
print(f"soak rank {rank}/{world} done", flush=True)
