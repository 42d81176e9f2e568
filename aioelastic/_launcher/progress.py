"""Progress of a long rendezvous: every few seconds, who has joined and what the node waits for.

An elastic handler announces ``RoundJoining`` when it starts to join and ``RoundCompleted``
when it is done. While it is joining, :func:`watch_rendezvous` wakes every ``interval``
seconds, asks the handler how many nodes have joined the next round, and reports a typed
:class:`RendezvousWaiting` event to the stream (the logging subscriber logs it) and, when asked,
one line on a console: silence during a ten-minute join timeout is what users hate most. It polls
a handler from outside, so it sits in the launcher layer, above the rendezvous it watches.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio

from aioelastic._clock import Clock, MonotonicClock
from aioelastic._concurrency import unwrap_single_error
from aioelastic._kinds.rendezvous import RendezvousWaiting, RoundJoining
from aioelastic.events._stream import EventStream
from aioelastic.rendezvous._errors import RendezvousError

__all__ = ["DEFAULT_INTERVAL", "RendezvousWaiting", "watch_rendezvous"]

logger = logging.getLogger("aioelastic.rendezvous.progress")

DEFAULT_INTERVAL = 5.0
"""Seconds between two progress reports of one join."""


@asynccontextmanager
async def watch_rendezvous(
    handler: Any,
    stream: EventStream | None = None,
    *,
    interval: float = DEFAULT_INTERVAL,
    console: TextIO | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[None]:
    """Report the progress of ``handler``'s joins while the block runs (see the module doc).

    With a ``stream``, the handler's own events are published there too (as ``rendezvous``).
    A handler without events is left alone. ``console`` gets one line per report;
    ``clock`` (default: the loop's monotonic clock) times the reports.
    """
    if not hasattr(handler, "subscribe") or not hasattr(handler, "settings"):
        yield
        return
    timer: Clock = clock if clock is not None else MonotonicClock()
    joining = anyio.Event()
    started = [0.0]

    def on_event(event: object) -> None:
        if isinstance(event, RoundJoining):
            started[0] = timer.now()
            joining.set()

    async def report() -> None:
        nonlocal joining
        settings = handler.settings
        while True:
            await joining.wait()
            joining = anyio.Event()
            while True:
                await timer.sleep_until(timer.now() + interval)  # periodic by nature
                if not handler.statistics().joining:
                    break
                waiting_for = str(getattr(handler, "waiting_for", ""))
                nodes: dict[int, str] = {}
                try:
                    if not waiting_for:
                        nodes = await handler.waiting_nodes()
                except RendezvousError as error:  # a progress line is not worth the run
                    logger.debug("no rendezvous progress report: %s", error)
                    continue
                event = RendezvousWaiting(
                    run_id=settings.run_id,
                    node=handler.node_id,
                    joined=len(nodes),
                    min_nodes=settings.min_nodes,
                    max_nodes=settings.max_nodes,
                    waited=timer.now() - started[0],
                    join_timeout=settings.join_timeout,
                    members=tuple(f"{node} at {addr}" for node, addr in nodes.items()),
                    waiting_for=waiting_for,
                )
                logger.info("%s", event.describe())
                if stream is not None:
                    stream.publish("rendezvous", event)
                if console is not None:
                    print(f"[aioelastic] {event.describe()}", file=console, flush=True)

    unsubscribe = handler.subscribe(on_event)
    detach = stream.attach(handler, "rendezvous") if stream is not None else None
    try:
        with unwrap_single_error():  # the block's own error leaves as itself, not as a group
            async with anyio.create_task_group() as tg:
                tg.start_soon(report)
                yield
                tg.cancel_scope.cancel()
    finally:
        unsubscribe()
        if detach is not None:
            detach()
