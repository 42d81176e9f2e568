"""The worker of ``bench/recovery.py``: gloo all_reduce steps in generations of the world.

It appends one JSON line per milestone to ``OUT/<pid>.jsonl`` with the wall clock (one
machine, so every process's clock is the same): ``assigned`` (the world arrived), ``pg``
(``init_process_group`` done), ``state`` (a fresh rank received the state), ``first`` (the
world's first all_reduce done). Under ``--recovery restart`` and torchrun the same script
runs: ``worker.worlds()`` then yields one world from the environment.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from aioelastic import worker

STATE_FLOATS = 1 << 18  # 1 MiB of "model" sent to a fresh rank


def main() -> None:
    out, steps, step_time = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    log = (out / f"{os.getpid()}.jsonl").open("a", buffering=1)

    def mark(name: str, world: worker.World) -> None:
        record = {"t": time.time(), "name": name, "gen": world.generation, "rank": world.rank}
        log.write(json.dumps({**record, "pid": os.getpid(), "fresh": world.is_fresh}) + "\n")

    state = torch.zeros(STATE_FLOATS)
    step = 0
    log.write(json.dumps({"t": time.time(), "name": "asking", "gen": 0, "pid": os.getpid()}))
    log.write("\n")
    for world in worker.worlds():
        mark("assigned", world)
        with world:
            world.init_process_group("gloo")
            mark("pg", world)
            if world.fresh_ranks:
                dist.broadcast(state, src=world.source_rank)
                mark("state", world)
            first = True
            while step < steps:
                world.check()
                value = torch.ones(1)
                dist.all_reduce(value)
                if first:
                    mark("first", world)
                    first = False
                step += 1
                time.sleep(step_time)
            dist.barrier()


if __name__ == "__main__":
    main()
