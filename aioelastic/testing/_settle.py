"""Wait until every other task is blocked, in time that does not grow with the number of tasks.

``anyio.wait_all_tasks_blocked`` on asyncio checks every task of the loop, and sleeps 0.1 s of
real time whenever one is still runnable; a cluster of 10,000 simulated nodes has 40,000
tasks, so each step of a manual clock cost seconds. On the stock asyncio loop the same
question has a cheaper answer: when this task resumes and the loop's queue of ready callbacks
is empty, no other task can run (a task waking from a done future, or just started, has its
step queued there). Other loops (uvloop, trio) use anyio's own answer; trio's is already cheap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized

import anyio

_FAST_TRIES = 10_000
"""Checkpoints before falling back to anyio's check: a callback that re-queues itself forever
(anyio retrying a cancellation into a shielded task) keeps the queue from ever emptying."""


def _ready_queue() -> Sized | None:
    """The stock asyncio loop's queue of ready callbacks, or None on any other loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio
        return None
    ready = getattr(loop, "_ready", None)
    return ready if isinstance(ready, Sized) else None


async def wait_all_tasks_blocked() -> None:
    """Return once every other task of the event loop is blocked (as anyio's function)."""
    ready = _ready_queue()
    if ready is not None:
        for _ in range(_FAST_TRIES):
            await anyio.lowlevel.checkpoint()
            if not ready:
                return
    await anyio.wait_all_tasks_blocked()
