"""What a timer server reports: typed events, rejection reasons and a statistics snapshot."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from aioelastic._subscribers import WarningEvent


class RejectReason(enum.StrEnum):
    """Why a request line was dropped (the keys of ``statistics().rejected``)."""

    TOO_LONG = "too_long"
    NOT_UTF8 = "not_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    BAD_VALUE = "bad_value"
    UNSUPPORTED_VERSION = "unsupported_version"
    FORBIDDEN_PID = "forbidden_pid"
    NO_SUCH_PROCESS = "no_such_process"
    NOT_WATCHED = "not_watched"


@dataclass(frozen=True, slots=True)
class TimerAcquired:
    """A process armed (or re-armed) a timer; ``deadline`` is on the server's monotonic clock."""

    pid: int
    scope_id: str
    deadline: float
    expiration_time: float
    signal: int


@dataclass(frozen=True, slots=True)
class TimerReleased:
    """A process released a timer it held."""

    pid: int
    scope_id: str


@dataclass(frozen=True, slots=True)
class TimerExpired(WarningEvent):
    """A timer reached its deadline; ``late`` is how long after the deadline it was seen."""

    pid: int
    scope_id: str
    deadline: float
    expiration_time: float
    signal: int
    late: float


@dataclass(frozen=True, slots=True)
class TimerReaped(WarningEvent):
    """The server signalled ``pid`` because ``scope_id`` expired.

    ``signal`` is the last signal sent; ``escalated`` says a SIGTERM went first and the process
    outlived the grace period. ``deadline`` is monotonic, ``expiration_time`` the client's wall
    clock value, as sent.
    """

    pid: int
    scope_id: str
    signal: int
    deadline: float
    expiration_time: float
    escalated: bool = False


@dataclass(frozen=True, slots=True)
class ProcessExited:
    """A watched process exited; its timers (``scopes``, possibly none) were dropped."""

    pid: int
    scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RequestRejected(WarningEvent):
    """A request line was dropped; ``detail`` says what was wrong with it."""

    reason: RejectReason
    detail: str
    pid: int | None = None


TimerEvent = (
    TimerAcquired | TimerReleased | TimerExpired | TimerReaped | ProcessExited | RequestRejected
)


@dataclass(frozen=True, slots=True)
class TimerServerStatistics:
    """A snapshot of a timer server's counters."""

    active_timers: int
    watched_processes: int
    requests: int
    acquires: int
    releases: int
    expired: int
    reaped: int
    rejected: Mapping[RejectReason, int] = field(default_factory=dict)
