"""A worker whose behaviour the agent tests choose on the command line.

It records its environment, then (depending on flags) fails, hangs under a watchdog timer,
blocks until the job has a given number of nodes, or starts a grandchild, and reports pids on
stdout so tests can check that nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from aioelastic import timer
from aioelastic.errors import record


def block_forever() -> None:
    threading.Event().wait()


def say(text: str) -> None:
    """Write one whole line (workers share the console: print() under -u writes in pieces)."""
    sys.stdout.write(f"{text}\n")


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, help="directory for one env record per worker start")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempts", type=int, default=1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--block-unless-nodes", type=int, default=0)
    parser.add_argument("--release-file", type=Path)
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    nodes = int(os.environ["GROUP_WORLD_SIZE"])
    if args.out:
        record_file = args.out / f"{attempt}-{nodes}-{rank}-{os.getpid()}.json"
        record_file.write_text(json.dumps(dict(os.environ)))
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [os.getpid()]
    if args.grandchild:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pids.append(child.pid)
    say(" ".join(["pids", *map(str, pids)]))
    if rank == args.fail_rank and attempt < args.fail_attempts:
        raise RuntimeError(f"rank {rank} fails on attempt {attempt}")
    if rank == args.hang_rank and attempt == 0:
        timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with timer.expires(after=args.budget, scope="hung-step"):
            block_forever()
    released = args.release_file is None or args.release_file.exists()
    if args.block_unless_nodes and (nodes != args.block_unless_nodes or not released):
        block_forever()
    if args.grandchild or args.ignore_sigterm:
        block_forever()
    say(f"done rank={rank} attempt={attempt} nodes={nodes}")


if __name__ == "__main__":
    main()
