"""Step marks: what ``world.step(n)`` costs per call, against the same loop without it.

The marks go where they go under ``aioelastic run``: a ``SOCK_SEQPACKET`` socket whose other end
a separate process drains (standing for the agent), in batches every 0.5 s. Rows:

* the bare loop (the reference);
* ``world.step(i)`` in it;
* ``world.step(i)`` and ``world.work_done()`` in it;
* ``world.step(i)`` without an agent (a no-op: torchrun, or no launcher).

Each row is the best of ``--repeats`` runs of ``--calls`` iterations, in this process's CPU
time; the cost per call is the row's time per iteration less the bare loop's. The target is
under 5 us per call. Run ``python -m bench.steps``.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable

from aioelastic.worker import _steps
from aioelastic.worker._protocol import WorldAssigned
from aioelastic.worker._world import World

TARGET_US = 5.0


def a_world() -> World:
    """A world of one process (no agent link: the marks' socket is separate)."""
    assigned = WorldAssigned(1, 0, 1, 0, False, 0, (), {"kind": "env"}, 60.0)
    return World(assigned, None)


def drain(sock: socket.socket, other: socket.socket) -> int:
    """Fork a process that reads ``sock`` until ``other``, its other end, closes (the agent's
    part)."""
    pid = os.fork()
    if pid == 0:
        other.close()
        while sock.recv(_steps.MAX_BATCH + 1):
            pass
        os._exit(0)
    return pid


def timed(body: Callable[[int], None], calls: int, repeats: int) -> float:
    """Best CPU seconds per iteration of ``body`` over ``repeats`` runs of ``calls`` (this
    process's CPU time: on a shared machine, wall time counts the others' turns too)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for i in range(calls):
            body(i)
        best = min(best, (time.process_time() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    world = a_world()
    total = 0

    def bare(i: int) -> None:
        nonlocal total
        total += i

    def step(i: int) -> None:
        nonlocal total
        total += i
        world.step(i)

    def step_and_done(i: int) -> None:
        nonlocal total
        total += i
        world.step(i)
        world.work_done()

    _steps._MARKS = _steps.StepMarks(None)
    unlinked = timed(step, args.calls, args.repeats)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    drainer = drain(ours, theirs)
    ours.close()
    _steps._MARKS = _steps.StepMarks(_steps._socket_sender(theirs))
    reference = timed(bare, args.calls, args.repeats)
    linked = timed(step, args.calls, args.repeats)
    with_done = timed(step_and_done, args.calls, args.repeats)
    marks = _steps._MARKS
    marks.close()
    theirs.close()
    os.waitpid(drainer, 0)
    rows = [
        ("bare loop (reference)", reference, None),
        ("world.step(i)", linked, linked - reference),
        ("world.step(i) + world.work_done()", with_done, with_done - reference),
        ("world.step(i), no agent (no-op)", unlinked, unlinked - reference),
    ]
    print(f"{'measure':<36} {'us/iteration':>12} {'us/call':>9}  target < {TARGET_US:g} us")
    for name, per_iteration, cost in rows:
        shown = "-" if cost is None else f"{cost * 1e6:.3f}"
        print(f"{name:<36} {per_iteration * 1e6:>12.3f} {shown:>9}")
    print(f"batches sent {marks.sent}, dropped {marks.dropped}; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
