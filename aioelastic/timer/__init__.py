"""Watchdog timers: a process (or task) arms a timer and is reaped if it does not release it.

``FileTimerServer``/``FileTimerClient`` speak PyTorch's FileTimer wire format over a FIFO;
``LocalTimerServer``/``LocalTimerClient`` do the same in-process. ``expires()`` arms a timer for
a block, as ``async with`` or ``with``; ``after="auto"`` learns the limit from earlier
blocks of the same scope (``LearnedTimeouts``).
"""

from typing import TYPE_CHECKING

__all__ = [
    "PIPE_BUF",
    "DeadlineHeap",
    "Expiry",
    "FileTimerClient",
    "FileTimerServer",
    "InvalidDurationError",
    "LearnedScope",
    "LearnedTimeouts",
    "LearningPolicy",
    "LineDecoder",
    "LocalTimerClient",
    "LocalTimerServer",
    "NoTimerClientError",
    "ProcessExited",
    "RejectReason",
    "Rejection",
    "RequestRejected",
    "RequestTooLargeError",
    "ScopeExpiredError",
    "Timer",
    "TimerAcquired",
    "TimerClient",
    "TimerConfigError",
    "TimerError",
    "TimerEvent",
    "TimerExpired",
    "TimerReaped",
    "TimerReleased",
    "TimerRequest",
    "TimerServerStatistics",
    "TimerServerUnavailableError",
    "WatchPolicy",
    "configure",
    "decode_line",
    "encode_request",
    "expires",
    "learned_limits",
    "read_learned",
]

if TYPE_CHECKING:
    from aioelastic.timer._api import Expiry, TimerClient, configure, expires
    from aioelastic.timer._codec import (
        PIPE_BUF,
        LineDecoder,
        Rejection,
        TimerRequest,
        decode_line,
        encode_request,
    )
    from aioelastic.timer._errors import (
        InvalidDurationError,
        NoTimerClientError,
        RequestTooLargeError,
        ScopeExpiredError,
        TimerConfigError,
        TimerError,
        TimerServerUnavailableError,
    )
    from aioelastic.timer._events import (
        ProcessExited,
        RejectReason,
        RequestRejected,
        TimerAcquired,
        TimerEvent,
        TimerExpired,
        TimerReaped,
        TimerReleased,
        TimerServerStatistics,
    )
    from aioelastic.timer._file_client import FileTimerClient
    from aioelastic.timer._file_server import FileTimerServer
    from aioelastic.timer._heap import DeadlineHeap, Timer
    from aioelastic.timer._learned import (
        LearnedScope,
        LearnedTimeouts,
        LearningPolicy,
        learned_limits,
        read_learned,
    )
    from aioelastic.timer._local import LocalTimerClient, LocalTimerServer
    from aioelastic.timer._policy import WatchPolicy

_LAZY = {
    "Expiry": "aioelastic.timer._api",
    "TimerClient": "aioelastic.timer._api",
    "configure": "aioelastic.timer._api",
    "expires": "aioelastic.timer._api",
    "LineDecoder": "aioelastic.timer._codec",
    "PIPE_BUF": "aioelastic.timer._codec",
    "Rejection": "aioelastic.timer._codec",
    "TimerRequest": "aioelastic.timer._codec",
    "decode_line": "aioelastic.timer._codec",
    "encode_request": "aioelastic.timer._codec",
    "InvalidDurationError": "aioelastic.timer._errors",
    "NoTimerClientError": "aioelastic.timer._errors",
    "RequestTooLargeError": "aioelastic.timer._errors",
    "ScopeExpiredError": "aioelastic.timer._errors",
    "TimerConfigError": "aioelastic.timer._errors",
    "TimerError": "aioelastic.timer._errors",
    "TimerServerUnavailableError": "aioelastic.timer._errors",
    "ProcessExited": "aioelastic.timer._events",
    "RejectReason": "aioelastic.timer._events",
    "RequestRejected": "aioelastic.timer._events",
    "TimerAcquired": "aioelastic.timer._events",
    "TimerEvent": "aioelastic.timer._events",
    "TimerExpired": "aioelastic.timer._events",
    "TimerReaped": "aioelastic.timer._events",
    "TimerReleased": "aioelastic.timer._events",
    "TimerServerStatistics": "aioelastic.timer._events",
    "FileTimerClient": "aioelastic.timer._file_client",
    "FileTimerServer": "aioelastic.timer._file_server",
    "DeadlineHeap": "aioelastic.timer._heap",
    "Timer": "aioelastic.timer._heap",
    "LearnedScope": "aioelastic.timer._learned",
    "LearnedTimeouts": "aioelastic.timer._learned",
    "LearningPolicy": "aioelastic.timer._learned",
    "learned_limits": "aioelastic.timer._learned",
    "read_learned": "aioelastic.timer._learned",
    "LocalTimerClient": "aioelastic.timer._local",
    "LocalTimerServer": "aioelastic.timer._local",
    "WatchPolicy": "aioelastic.timer._policy",
}
"""Where each exported name lives: imported on first use, so that a module that needs one part
of the timer (the event stream and the metrics need its events) does not load the rest."""


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
