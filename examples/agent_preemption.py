"""A worker that saves a checkpoint when it is preempted (SLURM and Kubernetes send SIGTERM).

The launcher forwards the signal and keeps relaying the workers' output until each has exited
(or ``--shutdown-timeout`` passed), so the handler's prints and its checkpoint both get through:

    aioelastic run --standalone --nproc-per-node 2 examples/agent_preemption.py /tmp/ckpt &
    sleep 3; kill -TERM %1    # each rank prints, saves /tmp/ckpt/rank-N.ckpt, exits 0

A SIGINT (Ctrl-C) is forwarded too: the workers' KeyboardInterrupt tracebacks are shown.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

SAVE_SECONDS = 1.0  # a checkpoint takes a while to write


def main() -> None:
    directory = Path(sys.argv[1])
    rank = os.environ["RANK"]

    def save_and_exit(signum: int, frame: FrameType | None) -> None:
        print(f"rank {rank}: {signal.Signals(signum).name}, saving a checkpoint", flush=True)
        time.sleep(SAVE_SECONDS)  # stands for serialising the model
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"rank-{rank}.ckpt").write_text(f"weights of rank {rank}\n")
        print(f"rank {rank}: checkpoint saved", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, save_and_exit)
    print(f"rank {rank}: training", flush=True)
    while True:  # the training loop
        time.sleep(0.05)


if __name__ == "__main__":
    main()
