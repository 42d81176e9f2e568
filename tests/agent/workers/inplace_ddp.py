"""examples/ddp_inplace.py, with a kill -9 of its own: the in-place DDP tests run it.

``--kill-at STEP --gate FIFO``: rank 1 of generation 1, at ``STEP``, waits until the test writes
a line to the named pipe ``FIFO`` (the test does once the spare said it is warm), then SIGKILLs
itself. A fresh rank prints which of the learned modules it held when its state came
(``warm fresh rank R: torch._dynamo True``). The last argument is where rank 0 leaves the final
weights, as the example does.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from aioelastic import worker

EXAMPLE = Path(__file__).parents[3] / "examples" / "ddp_inplace.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--gate", type=Path)
    parser.add_argument("weights")
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("aioelastic.worker").setLevel(logging.INFO)
    spec = importlib.util.spec_from_file_location("ddp_inplace", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    example: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    batch, hand_over = example.batch, worker.hand_over
    first_life = os.environ.get("AIOELASTIC_SPARE") is None

    def batch_or_die(step: int, rank: int) -> Any:
        if first_life and rank == 1 and step == options.kill_at:
            with options.gate.open() as gate:  # blocks until the test says the spare is warm
                gate.readline()
            os.kill(os.getpid(), signal.SIGKILL)
        return batch(step, rank)

    def hand_over_seen(world: worker.World, *args: Any, **kwargs: Any) -> Any:
        if world.is_fresh:
            held = "torch._dynamo" in sys.modules
            print(f"warm fresh rank {world.rank}: torch._dynamo {held}", flush=True)
        return hand_over(world, *args, **kwargs)

    example.batch = batch_or_die
    worker.hand_over = hand_over_seen  # the example calls worker.hand_over
    sys.argv = [str(EXAMPLE), options.weights]
    example.main()


if __name__ == "__main__":
    main()
