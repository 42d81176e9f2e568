"""The logging subscriber: each record becomes one stdlib ``logging`` record with its fields.

The message is short and readable (``agent WorkerFailed rank=1 cause='exit 3'``); the same
data travels as structured attributes on the log record (``record.event_kind``,
``record.event_source``, ``record.event_node``, ``record.event_fields``), so a JSON log
formatter can emit it without parsing text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aioelastic._subscribers import WarningEvent
from aioelastic.events._jsonl import to_data
from aioelastic.events._stream import EventRecord

WARNING_KINDS: tuple[type, ...] = (WarningEvent,)
"""Event types logged at WARNING by default (something went wrong or changed); others at INFO."""


def describe_fields(fields: Mapping[str, Any], limit: int = 200) -> str:
    """``k=v`` pairs of an event's fields, nested objects flattened with dots, cut at ``limit``."""
    parts: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        else:
            parts.append(f"{prefix[:-1]}={value!r}")

    walk("", fields)
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LoggingSubscriber:
    """Logs every record to ``logger`` (default ``aioelastic.events``).

    Events of the ``warning_kinds`` types are logged at WARNING, the rest at ``level`` (INFO).
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        level: int = logging.INFO,
        warning_kinds: tuple[type, ...] = WARNING_KINDS,
    ) -> None:
        self.logger = logger if logger is not None else logging.getLogger("aioelastic.events")
        self.level = level
        self.warning_kinds = warning_kinds

    def __repr__(self) -> str:
        return f"LoggingSubscriber({self.logger.name!r})"

    def __call__(self, record: EventRecord) -> None:
        level = logging.WARNING if isinstance(record.event, self.warning_kinds) else self.level
        if not self.logger.isEnabledFor(level):
            return
        fields = to_data(record.event)
        self.logger.log(
            level,
            "%s %s %s",
            record.source,
            record.kind,
            describe_fields(fields),
            extra={
                "event_kind": record.kind,
                "event_source": record.source,
                "event_node": record.node,
                "event_time": record.time,
                "event_fields": fields,
            },
        )
