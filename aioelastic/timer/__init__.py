"""Watchdog timers: a process (or task) arms a timer and is reaped if it does not release it.

``FileTimerServer``/``FileTimerClient`` speak PyTorch's FileTimer wire format over a FIFO;
``LocalTimerServer``/``LocalTimerClient`` do the same in-process. ``expires()`` arms a timer for
a block, as ``async with`` or ``with``; ``after="auto"`` learns the limit from earlier
blocks of the same scope (``LearnedTimeouts``).
"""

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
