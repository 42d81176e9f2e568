"""A worker for the stack-capture tests: rank --hang-rank sleeps in ``stuck_in_load_batch``
under the shared timer scope "step"; the other ranks wait for it in ``wait_for_peer``.

Every rank first meets the others at the test's barrier (a UNIX socket it serves), so all of
them are inside the step when the first timer expires. A budget of 0 arms no timer (the ranks
just hang, for ``aioelastic status --stacks``). A restarted group succeeds; with ``--once DIR``
so does any later group (a membership change does not count as a restart)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
import time
from contextlib import nullcontext

from aioelastic import timer


def stuck_in_load_batch() -> None:
    time.sleep(3600)


def wait_for_peer() -> None:
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang-rank", type=int, default=0)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--ignore-stack-signal", action="store_true")
    parser.add_argument("--barrier", help="the test's barrier socket (none: start at once)")
    parser.add_argument("--once", help="a directory marking the ranks that ran once already")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) > 0:
        return  # the restarted group succeeds
    if args.once:
        mark = os.path.join(args.once, f"rank{rank}")
        if os.path.exists(mark):
            return
        open(mark, "x").close()
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    if args.ignore_stack_signal:
        signal.signal(int(os.environ["AIOELASTIC_STACK_SIGNAL"]), signal.SIG_IGN)
    for _ in range(args.threads):
        threading.Thread(target=wait_for_peer, daemon=True).start()
    if args.barrier:
        with socket.socket(socket.AF_UNIX) as barrier:
            barrier.connect(args.barrier)
            barrier.sendall(b"ready\n")
            barrier.recv(1)  # the test answers once every rank is here
    print("ready", flush=True)
    step = timer.expires(after=args.budget, scope="step") if args.budget else nullcontext()
    with step:
        if rank == args.hang_rank:
            stuck_in_load_batch()
        else:
            wait_for_peer()


if __name__ == "__main__":
    main()
