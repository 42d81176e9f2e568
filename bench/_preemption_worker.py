"""The worker of ``bench/preemption.py``: a gloo all_reduce a step, on the worker API.

Under ``aioelastic run`` ``world.should_stop(step)`` says when to save; under torchrun it is
always False, and a SIGTERM handler saves instead (torchrun forwards the signal to the node
that got it). Either way the rank writes ``OUT/rank-R.json``: how it saved, at which step and
when (the wall clock: one machine). A rank whose collective broke writes ``OUT/broke-R.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from aioelastic import worker


def main() -> None:
    out, step_time = Path(sys.argv[1]), float(sys.argv[2])
    step = 0
    rank = int(os.environ["RANK"])

    def save(how: str) -> None:
        record = {"rank": rank, "step": step, "how": how, "t": time.time()}
        (out / f"rank-{rank}.json").write_text(json.dumps(record))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        save("handler")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    for world in worker.worlds():
        with world:
            world.init_process_group("gloo")
            try:
                while True:
                    if world.should_stop(step):
                        save("should_stop")
                        return
                    dist.all_reduce(torch.ones(1))
                    if step == 3:
                        (out / f"training-{rank}").write_text("")
                    step += 1
                    time.sleep(step_time)
            except RuntimeError:  # a peer went away: gloo says so at once
                record = {"rank": rank, "step": step, "t": time.time()}
                (out / f"broke-{rank}.json").write_text(json.dumps(record))
                raise


if __name__ == "__main__":
    main()
