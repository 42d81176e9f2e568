"""A torch worker that uses the agent's store, as under torchrun: with
``TORCHELASTIC_USE_AGENT_STORE=True`` torch's ``env://`` opens a client to ``MASTER_ADDR`` and
``MASTER_PORT`` (the agent's listener) and no rank binds a port of its own.

    aioelastic run --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 examples/agent_torch_store.py

Each rank says where its store is, then all ranks sum their ranks. ``--fail-once FILE`` makes
rank 1 fail on the first attempt (creating FILE), so the next attempt shows a restart.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from aioelastic.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-once", type=Path, default=None)
    args = parser.parse_args()
    env = os.environ
    attempt = env["TORCHELASTIC_RESTART_COUNT"]
    print(
        f"rank {env['RANK']} attempt {attempt} agent store {env['TORCHELASTIC_USE_AGENT_STORE']} "
        f"at {env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        flush=True,
    )
    dist.init_process_group("gloo")  # env://: a TCPStore client of the agent's store
    try:
        if args.fail_once is not None and dist.get_rank() == 1 and not args.fail_once.exists():
            args.fail_once.touch()
            raise RuntimeError("rank 1 fails once, after joining the group")
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        world = dist.get_world_size()
        print(f"rank {dist.get_rank()}/{world} attempt {attempt}: sum {value.item():g}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
