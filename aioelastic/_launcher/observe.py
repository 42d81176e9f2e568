"""Wire a running job's components to the standard subscribers in one ``async with``.

``aioelastic run`` calls :func:`observe` with its agent, an optional ``--events-file`` and an
optional ``--metrics-port``; embedding programs can do the same with their own components
(``from aioelastic.events import observe``). It composes the event stream, its subscribers and
the metrics server, so it sits in the launcher layer, above every part it wires.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import anyio

from aioelastic._concurrency import unwrap_single_error
from aioelastic.events._jsonl import JsonLinesWriter
from aioelastic.events._logging import WARNING_KINDS, LoggingSubscriber
from aioelastic.events._stream import Emitter, EventStream
from aioelastic.timer._events import TimerAcquired, TimerReleased

logger = logging.getLogger(__name__)

PER_STEP_KINDS = (TimerAcquired, TimerReleased)
"""Events a training loop emits at every step: counted by the metrics, kept out of the file."""


@asynccontextmanager
async def observe(
    components: Mapping[str, Emitter],
    *,
    events_file: str | os.PathLike[str] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "0.0.0.0",
    node: str | None = None,
    log_warnings: bool = True,
) -> AsyncIterator[EventStream]:
    """Gather ``components`` (source name -> component) into one stream while the block runs.

    Every record is logged at DEBUG on ``aioelastic.events`` (failures at WARNING, unless
    ``log_warnings`` is false because the caller reports them itself, as ``aioelastic run``'s
    console does); with
    ``events_file`` it is appended there as a JSON line (except the per-step
    :data:`PER_STEP_KINDS`); with ``metrics_port`` Prometheus metrics are served on that port
    (0 picks a free one; see the log for which).
    """
    stream = EventStream(node=node)
    warning_kinds = WARNING_KINDS if log_warnings else ()
    stream.subscribe(LoggingSubscriber(level=logging.DEBUG, warning_kinds=warning_kinds))
    with unwrap_single_error():  # the block's own error leaves as itself, not as a group
        async with AsyncExitStack() as stack:
            if events_file is not None:
                writer = stack.enter_context(
                    JsonLinesWriter(events_file, skip_kinds=PER_STEP_KINDS)
                )
                stream.subscribe(writer)
            if metrics_port is not None:
                from aioelastic.metrics import PrometheusMetrics, metrics_listener, serve_metrics

                metrics = PrometheusMetrics()
                listener = await metrics_listener(metrics_port, metrics_host)
                tg = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(tg.cancel_scope.cancel)
                port = await tg.start(serve_metrics, metrics, listener)
                stream.subscribe(metrics)
                logger.info("serving Prometheus metrics on %s:%d/metrics", metrics_host, port)
            for source, component in components.items():
                stack.callback(stream.attach(component, source))
            yield stream
