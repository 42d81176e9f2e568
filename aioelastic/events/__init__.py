"""One typed event stream across the parts, and its standard subscribers.

Components report frozen event dataclasses (``aioelastic.timer``'s ``TimerReaped``,
``aioelastic.agent``'s ``WorkerFailed``, ...); an :class:`EventStream` gathers them from every
component attached to it and hands each, as an :class:`EventRecord`, to subscribers: a
:class:`LoggingSubscriber`, a :class:`JsonLinesWriter` (``aioelastic run --events-file``), the
Prometheus metrics of ``aioelastic.metrics``, or a test.

This package sits below the rendezvous and the agent it observes: it reads their event types
from ``aioelastic/_kinds/`` (the layer below it) and importing it loads none of them. Reading
a job's logs back is here too: ``goodput_report`` (what ``aioelastic report`` prints: goodput,
badput by cause, stragglers) and the timeline, imported on first use. ``observe`` (which wires
a job's components to the subscribers) and ``watch_rendezvous`` (which polls a rendezvous
handler) live in the launcher layer above; they are re-exported here lazily.
"""

from typing import TYPE_CHECKING

from aioelastic._subscribers import WarningEvent
from aioelastic.events._jsonl import (
    EventLogError,
    JsonLinesWriter,
    LoggedEvent,
    decode_line,
    encode_record,
    read_event_log,
    to_data,
)
from aioelastic.events._logging import WARNING_KINDS, LoggingSubscriber
from aioelastic.events._stream import (
    Emitter,
    EventRecord,
    EventStream,
    EventStreamStatistics,
    Subscriber,
)

__all__ = [
    "WARNING_KINDS",
    "Emitter",
    "EventLogError",
    "EventRecord",
    "EventStream",
    "EventStreamStatistics",
    "GoodputReport",
    "JsonLinesWriter",
    "LoggedEvent",
    "LoggingSubscriber",
    "RendezvousWaiting",
    "Subscriber",
    "WarningEvent",
    "decode_line",
    "encode_record",
    "goodput_report",
    "observe",
    "read_event_log",
    "to_data",
    "watch_rendezvous",
]

if TYPE_CHECKING:
    from aioelastic._kinds.rendezvous import RendezvousWaiting
    from aioelastic._launcher.observe import observe
    from aioelastic._launcher.progress import watch_rendezvous
    from aioelastic.events._goodput import GoodputReport, goodput_report

_LAZY = {
    "observe": "aioelastic._launcher.observe",
    "RendezvousWaiting": "aioelastic._kinds.rendezvous",
    "watch_rendezvous": "aioelastic._launcher.progress",
    "GoodputReport": "aioelastic.events._goodput",
    "goodput_report": "aioelastic.events._goodput",
}
"""Names imported on first use (not by ``import``): the launcher layer's, and the heavier views."""


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
