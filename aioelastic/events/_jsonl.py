"""The JSON-lines event log: one object per record, written by a subscriber, read back as data.

A line is ``{"time": 1700000000.123, "node": "host-a", "source": "agent",
"kind": "WorkerFailed", "event": {...}}``; ``event`` holds the dataclass's fields (nested
dataclasses as objects, enums as their values, tuples as lists). The codec is pure; only
:class:`JsonLinesWriter` and :func:`read_event_log` touch files.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from aioelastic.events._stream import EventRecord


class EventLogError(ValueError):
    """A line of an event log is not a record this module wrote."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {reason}")


def to_data(value: Any) -> Any:
    """Turn an event (or any value inside one) into JSON-compatible data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return to_data(value.value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(to_data(k)): to_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_data(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def encode_record(record: EventRecord) -> str:
    """One JSON line (without the newline) for ``record``."""
    return json.dumps(
        {
            "time": record.time,
            "node": record.node,
            "source": record.source,
            "kind": record.kind,
            "event": to_data(record.event),
        },
        separators=(",", ":"),
    )


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """A record read back from an event log: the event's fields as plain data."""

    time: float
    node: str
    source: str
    kind: str
    data: Mapping[str, Any]


def decode_line(text: str, *, path: str = "<events>", line: int = 0) -> LoggedEvent:
    """Parse one line of an event log; raise :class:`EventLogError` naming the line."""
    try:
        obj = json.loads(text)
    except ValueError as error:
        raise EventLogError(
            path, line, f"not JSON ({error}); is this a file written by --events-file?"
        ) from None
    if not isinstance(obj, dict):
        raise EventLogError(path, line, f"expected an object, got {type(obj).__name__}")
    try:
        when, node, source, kind, data = (
            obj[name] for name in ("time", "node", "source", "kind", "event")
        )
    except KeyError as error:
        raise EventLogError(path, line, f"missing field {error}") from None
    if not isinstance(when, int | float) or isinstance(when, bool):
        raise EventLogError(path, line, f"time must be a number, got {when!r}")
    if not (isinstance(node, str) and isinstance(source, str) and isinstance(kind, str)):
        raise EventLogError(path, line, "node, source and kind must be strings")
    if not isinstance(data, dict):
        raise EventLogError(path, line, f"event must be an object, got {type(data).__name__}")
    return LoggedEvent(float(when), node, source, kind, data)


def read_event_log(path: str | os.PathLike[str]) -> Iterator[LoggedEvent]:
    """Yield the records of an event log in file order (blank lines are skipped)."""
    name = os.fspath(path)
    with open(name, encoding="utf-8") as file:
        for number, text in enumerate(file, start=1):
            if text.strip():
                yield decode_line(text, path=name, line=number)


class JsonLinesWriter:
    """A subscriber appending each record as one JSON line to ``path`` (flushed per line).

    Several agents may append to one file: each line is written with a single ``write`` to a
    file opened in append mode. Events of the ``skip_kinds`` types are not written. Use as
    ``with JsonLinesWriter(path) as writer:`` or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str], *, skip_kinds: tuple[type, ...] = ()) -> None:
        self.path = Path(path)
        self.skip_kinds = skip_kinds
        try:
            self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as error:
            raise EventLogError(
                str(self.path), 0, f"cannot open the event log for appending ({error.strerror})"
            ) from None
        self.written = 0

    def __repr__(self) -> str:
        return f"JsonLinesWriter({str(self.path)!r}, written={self.written})"

    def __call__(self, record: EventRecord) -> None:
        if self._file is None or isinstance(record.event, self.skip_kinds):
            return
        self._file.write(encode_record(record) + "\n")
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        """Close the file; later records are dropped."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
