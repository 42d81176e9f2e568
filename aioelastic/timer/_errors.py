"""The timer's exceptions: misuse (bad arguments, no client) apart from a missing server."""

from __future__ import annotations

import os


class TimerError(Exception):
    """Base class of every watchdog-timer failure."""


class NoTimerClientError(TimerError, RuntimeError):
    """``expires()`` was used with no client passed and none configured."""

    def __init__(self) -> None:
        super().__init__(
            "no timer client configured: call aioelastic.timer.configure(client) first, "
            "or pass client= to expires()"
        )


class TimerServerUnavailableError(TimerError, BrokenPipeError):
    """No timer server reads the FIFO (missing, not a FIFO, or nobody reading it)."""

    def __init__(self, file_path: str | os.PathLike[str], waited: float, reason: str) -> None:
        self.file_path = os.fspath(file_path)
        self.waited = waited
        self.reason = reason
        super().__init__(
            f"no timer server is reading {self.file_path!r} (waited {waited:g} s; {reason}); "
            "start a FileTimerServer on that path before acquiring timers"
        )


class RequestTooLargeError(TimerError, ValueError):
    """A request does not fit in one atomic pipe write, so it was not sent."""

    def __init__(self, size: int, limit: int, scope_id: str) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"timer request for scope {scope_id[:80]!r} is {size} bytes, over the {limit}-byte "
            "atomic pipe write limit (PIPE_BUF); use a shorter scope_id"
        )


class InvalidDurationError(TimerError, ValueError):
    """A timer was asked to last a negative, infinite or NaN time."""

    def __init__(self, name: str, value: object, advice: str = "") -> None:
        self.value = value
        if advice:
            super().__init__(f"{name}={value!r}: {advice}")
            return
        super().__init__(
            f"{name} must be a finite number of seconds, got {value!r}; "
            "pass how long the block may take (or after='auto' with a named scope)"
        )


class TimerConfigError(TimerError, ValueError):
    """A server or client was configured with a value it cannot use."""


class ScopeExpiredError(TimerError, TimeoutError):
    """An in-process scope outlived its timer and was cancelled by a ``LocalTimerServer``."""

    def __init__(self, scope_id: str, after: float) -> None:
        self.scope_id = scope_id
        self.after = after
        super().__init__(
            f"scope {scope_id!r} did not finish within {after:g} s and was cancelled by the "
            "timer server; raise 'after' or find what blocks it"
        )
