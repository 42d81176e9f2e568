"""Every rank of a preempted job saves at the same step (run it under ``aioelastic run``).

    aioelastic run --standalone --nproc-per-node 2 examples/preemption_loop.py /tmp/ckpt &
    sleep 3; kill -TERM %1    # "run preempted, saved at step S"; /tmp/ckpt/rank-N.step says S

The signal may reach any node of a multi-node job: every rank on every node stops at the same
step. ``world.should_stop(step)`` costs one non-blocking look at the agent's socket per step.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from aioelastic import worker


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for world in worker.worlds():
        with world:
            for step in itertools.count():
                if world.should_stop(step):  # True on every rank at the same step
                    (out / f"rank-{world.rank}.step").write_text(f"{step}\n")  # the save
                    print(f"rank {world.rank}: saved at step {step}", flush=True)
                    return
                if step == 0:  # from the first should_stop on, the agent tells, not signals
                    print(f"rank {world.rank}: training", flush=True)
                time.sleep(0.02)  # one training step


if __name__ == "__main__":
    main()
