"""One typed event stream across the parts, and its standard subscribers.

Components keep their own frozen event dataclasses (``aioelastic.timer``'s ``TimerReaped``,
``aioelastic.agent``'s ``WorkerFailed``, ...); an :class:`EventStream` gathers them from every
component attached to it and hands each, as an :class:`EventRecord`, to subscribers: a
:class:`LoggingSubscriber`, a :class:`JsonLinesWriter` (``aioelastic run --events-file``), the
Prometheus metrics of ``aioelastic.metrics``, or a test.
"""

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
from aioelastic.events._observe import observe
from aioelastic.events._progress import RendezvousWaiting, watch_rendezvous
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
    "JsonLinesWriter",
    "LoggedEvent",
    "LoggingSubscriber",
    "RendezvousWaiting",
    "Subscriber",
    "decode_line",
    "encode_record",
    "observe",
    "read_event_log",
    "to_data",
    "watch_rendezvous",
]
