"""A worker for ``aioelastic run``: every step runs under a watchdog timer; rank 2 hangs in
step 1 of the first attempt, the watchdog reaps it, and the restarted group finishes.

    aioelastic run --standalone --nproc-per-node 4 --max-restarts 1 examples/agent_watchdog.py
"""

from __future__ import annotations

import os
import threading
import time

from aioelastic import timer
from aioelastic.errors import record

STEPS = 3
STEP_BUDGET = 1.0  # seconds a step may take before the watchdog kills the worker


@record
def main() -> None:
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    for step in range(STEPS):
        with timer.expires(after=STEP_BUDGET, scope=f"step-{step}"):
            if rank == 2 and step == 1 and attempt == 0:
                print(f"step {step}: stuck (a hung collective, say)", flush=True)
                threading.Event().wait()  # never returns: only the watchdog ends this
            time.sleep(0.05)  # the step's work
        print(f"step {step} done (attempt {attempt})", flush=True)


if __name__ == "__main__":
    main()
