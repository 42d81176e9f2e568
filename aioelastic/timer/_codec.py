"""The pure FIFO wire codec: one JSON object per line, version 1 exactly as PyTorch writes it.

``encode_request`` produces the bytes a client writes in one ``os.write``; ``LineDecoder`` turns
whatever a read returned into requests and rejections (``feed``), or into the requests' bare
fields (``feed_fields``, what the server applies: no object per request). Partial lines are
buffered until their newline arrives; a line longer than ``PIPE_BUF`` cannot have been written
atomically, so it is discarded up to its newline and reported once. A bad line costs that line
only.
"""

from __future__ import annotations

import json
import math
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any, cast

from aioelastic.timer._events import RejectReason

PIPE_BUF = 4096
"""Largest write the kernel keeps atomic on a pipe (Linux); lines are capped at this size."""

WIRE_VERSION = 1

_NSIG = _signal.NSIG
"""Signal numbers run below this; a larger ``signal`` is no signal and cannot be armed."""


@dataclass(frozen=True, slots=True)
class TimerRequest:
    """An acquire (``expiration_time >= 0``, wall clock) or release (negative) for a scope.

    ``signal`` is what the server sends when the timer expires; ``<= 0`` means report only.
    """

    pid: int
    scope_id: str
    expiration_time: float
    signal: int = 0

    @property
    def is_release(self) -> bool:
        return self.expiration_time < 0

    @property
    def worker_pid(self) -> int:
        """PyTorch's name for ``pid`` (for ``log_event`` callbacks written for torch)."""
        return self.pid

    def to_json(self) -> str:
        """The version-1 JSON object, as PyTorch's ``FileTimerRequest.to_json()`` gives it."""
        return encode_request(self)[:-1].decode()


RequestFields = tuple[int, str, float, int]
"""A well-formed request's ``(pid, scope_id, expiration_time, signal)``."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A line the decoder could not turn into a request."""

    reason: RejectReason
    detail: str
    pid: int | None = None


def encode_request(request: TimerRequest) -> bytes:
    """Encode ``request`` as one version-1 line, byte-for-byte what PyTorch's client writes."""
    body = json.dumps(
        {
            "version": WIRE_VERSION,
            "pid": request.pid,
            "scope_id": request.scope_id,
            "expiration_time": request.expiration_time,
            "signal": request.signal,
        }
    )
    return body.encode() + b"\n"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _snippet(line: bytes) -> str:
    text = line[:120].decode("utf-8", "backslashreplace")
    return text + ("..." if len(line) > 120 else "")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


_FIELDS: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("pid", _is_int, "an integer"),
    ("scope_id", _is_str, "a string"),
    ("expiration_time", _is_number, "a number"),
    ("signal", _is_int, "an integer"),
)


_JSON = json.JSONDecoder()


def decode_line(line: bytes) -> TimerRequest | Rejection:
    """Decode one line (without its newline)."""
    return _as_request(_decode_fields(line))


def _as_request(item: RequestFields | Rejection) -> TimerRequest | Rejection:
    return item if isinstance(item, Rejection) else TimerRequest(*item)


def _decode_fields(line: bytes) -> RequestFields | Rejection:
    if len(line) >= PIPE_BUF:
        return Rejection(RejectReason.TOO_LONG, f"line of {len(line) + 1} bytes: {_snippet(line)}")
    try:
        obj = _JSON.decode(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Rejection(RejectReason.NOT_UTF8, f"{exc.reason} at byte {exc.start}")
    except ValueError as exc:
        return Rejection(RejectReason.INVALID_JSON, f"{exc}: {_snippet(line)}")
    except RecursionError:
        return Rejection(RejectReason.INVALID_JSON, f"nested too deeply: {_snippet(line)}")
    return _request_from(obj, line)


def _request_from(obj: object, line: bytes) -> RequestFields | Rejection:
    """The request's fields a decoded line holds, or why it holds none."""
    if type(obj) is dict:
        # Fast path for a well-formed line; anything else gets the detailed checks below.
        pid, scope_id, signal = obj.get("pid"), obj.get("scope_id"), obj.get("signal")
        expiration, version = obj.get("expiration_time"), obj.get("version")
        if (
            type(version) is int
            and version == WIRE_VERSION
            and type(pid) is int
            and type(scope_id) is str
            and type(signal) is int
            and signal < _NSIG
            and (type(expiration) is float or type(expiration) is int)
            and math.isfinite(expiration)
        ):
            return (pid, scope_id, float(expiration), signal)
    return _diagnose(obj, line)


_SCAN = make_scanner(cast(Any, _JSON))
"""The C scanner behind ``json.loads``: one value from exactly the given offset, and its end."""


def _decode_line_fields(line: bytes) -> RequestFields | Rejection:
    """:func:`_decode_fields`, fast for a well-formed line: the line alone is scanned by the C
    parser (no per-line whitespace regex and checks of ``json.loads``) and must be exactly one
    value; anything else takes the slow path, which says why. A line's result comes from its
    own bytes only, so a crafted line can neither lend values to another nor take them."""
    if len(line) < PIPE_BUF and line[:1] == b"{":
        try:
            text = line.decode()
            value, end = _SCAN(text, 0)
        except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
            return _decode_fields(line)
        if end == len(text):
            return _request_from(value, line)
    return _decode_fields(line)


def _diagnose(obj: object, line: bytes) -> Rejection:
    """Say what is wrong with a decoded line the fast path refused."""
    if not isinstance(obj, dict):
        return Rejection(RejectReason.NOT_AN_OBJECT, f"not a JSON object: {_snippet(line)}")
    pid = obj.get("pid")
    pid = pid if _is_int(pid) else None
    version = obj.get("version")
    if version != WIRE_VERSION or not _is_int(version):
        return Rejection(RejectReason.UNSUPPORTED_VERSION, f"version {version!r}, expected 1", pid)
    for name, valid, kind in _FIELDS:
        if name not in obj:
            return Rejection(RejectReason.MISSING_FIELD, f"no {name!r} field", pid)
        value = obj[name]
        if not valid(value):
            return Rejection(RejectReason.WRONG_TYPE, f"{name!r} is {value!r}, not {kind}", pid)
    if obj["signal"] >= _NSIG:
        return Rejection(
            RejectReason.BAD_VALUE, f"signal {obj['signal']} is not below {_NSIG}", pid
        )
    return Rejection(RejectReason.BAD_VALUE, f"expiration_time is {obj['expiration_time']!r}", pid)


class LineDecoder:
    """Split a byte stream into lines and decode each; keeps the partial tail between feeds."""

    def __init__(self) -> None:
        self._tail = b""
        self._skipping = False

    @property
    def pending(self) -> int:
        """Bytes buffered for a line whose newline has not arrived yet."""
        return len(self._tail)

    def feed(self, data: bytes) -> list[TimerRequest | Rejection]:
        """Decode every complete line in ``data`` (after what was buffered)."""
        return [_as_request(item) for item in self.feed_fields(data)]

    def feed_fields(self, data: bytes) -> list[RequestFields | Rejection]:
        """:meth:`feed`, giving each request as its bare fields (:data:`RequestFields`)."""
        lines = (self._tail + data).split(b"\n") if self._tail else data.split(b"\n")
        tail = lines.pop()
        if self._skipping and lines:
            self._skipping = False
            del lines[0]
        out = [_decode_line_fields(line) for line in lines if line.strip()]
        if self._skipping:
            tail = b""
        elif len(tail) >= PIPE_BUF:
            out.append(
                Rejection(RejectReason.TOO_LONG, f"line over {PIPE_BUF} bytes: {_snippet(tail)}")
            )
            self._skipping = True
            tail = b""
        self._tail = tail
        return out
