"""The DDP worker of ``bench/recovery.py``: a training loop written the way most scripts are.

``python _recovery_ddp_worker.py OUT STEPS STEP_TIME MODEL CHECKPOINT_EVERY [SYNC]``. Each
world: the process group, the state to the fresh ranks (``worker.hand_over``, before ``DDP``: its
constructor copies rank 0's module), ``DDP(model)``, then the optimizer built over
``ddp.parameters()`` (after DDP, as most scripts do: plain SGD, so it holds no state a survivor
would lose with it), then the steps. Under torchrun (and ``--recovery restart``) the same script
loads the last checkpoint (rank 0 writes one every CHECKPOINT_EVERY steps) and re-does the
steps after it. ``SYNC`` ``skip``: ``DDP(model, init_sync=not handed.synced)``, DDP's
constructor does not copy rank 0's module again after ``hand_over`` did (default ``always``).

One JSON line per milestone to ``OUT/<pid>.jsonl``, with the wall clock (one machine: every
process reads the same clock): ``asking``, ``warm`` (a spare imported what the workers had
loaded), ``assigned``, ``pg``, ``state`` (``hand_over`` returned, or the checkpoint was
loaded), ``ddp``, and ``step`` after each optimizer step (with the step's number).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from aioelastic import worker

MODELS = {"mlp": (64, 256, 2), "100m": (4096, 4096, 6)}
"""Width in, hidden width, layers: a small MLP, and one of about 100M parameters (6 x 4096^2)."""

BATCH = 8


def build(name: str) -> torch.nn.Module:
    width, hidden, layers = MODELS[name]
    sizes = [width] + [hidden] * (layers - 1) + [width]
    blocks: list[torch.nn.Module] = []
    for n_in, n_out in itertools.pairwise(sizes):
        blocks += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks[:-1])


class _WarmMark(logging.Handler):
    """Marks ``warm`` when this spare says it imported the learned modules (see _warm.py)."""

    def __init__(self, mark: Any) -> None:
        super().__init__(logging.INFO)
        self._mark = mark

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("warming: imported"):
            self._mark("warm")


def main() -> None:
    out, steps, step_time = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    model_name, every = sys.argv[4], int(sys.argv[5])
    skip_sync = sys.argv[6:] == ["skip"]
    checkpoint = out / "checkpoint.pt"
    log = (out / f"{os.getpid()}.jsonl").open("a", buffering=1)
    place = {"gen": 0, "rank": -1, "fresh": False}

    def mark(name: str, **more: object) -> None:
        record = {"t": time.time(), "name": name, "pid": os.getpid(), **place, **more}
        log.write(json.dumps(record) + "\n")

    logging.getLogger("aioelastic.worker").addHandler(_WarmMark(mark))
    logging.getLogger("aioelastic.worker").setLevel(logging.INFO)
    torch.manual_seed(0)
    model = build(model_name)
    step, first = 0, True
    mark("asking")
    for world in worker.worlds():
        place.update(gen=world.generation, rank=world.rank, fresh=world.is_fresh)
        mark("assigned")
        with world:
            world.init_process_group("gloo")
            mark("pg")
            resume, first = first and checkpoint.exists() and not world.fresh_ranks, False
            synced = False
            if resume:
                saved = torch.load(checkpoint)  # a restart: go on from the last checkpoint
                model.load_state_dict(saved["model"])
                step = int(saved["step"])
                mark("state", resumed=step)
            else:
                handed = worker.hand_over(world, model, step=step)
                step, synced = handed.step, handed.synced
                mark("state")
            init_sync = not (skip_sync and synced)
            ddp = torch.nn.parallel.DistributedDataParallel(model, init_sync=init_sync)
            mark("ddp")
            optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
            while step < steps:
                world.check()
                generator = torch.Generator().manual_seed(step * 1000 + world.rank)
                inputs = torch.randn(BATCH, MODELS[model_name][0], generator=generator)
                loss = ddp(inputs).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                mark("step", step=step)
                if step % every == 0 and world.rank == 0:
                    state = {"model": model.state_dict(), "step": step}
                    torch.save(state, str(checkpoint) + ".new")
                    os.replace(str(checkpoint) + ".new", checkpoint)
                time.sleep(step_time)


if __name__ == "__main__":
    main()
