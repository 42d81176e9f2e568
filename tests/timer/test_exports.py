"""The public surface of ``aioelastic.timer`` is exactly what we meant to export."""

from __future__ import annotations

import aioelastic.timer as timer

EXPECTED = {
    # servers, clients and the block API
    "FileTimerServer", "FileTimerClient", "LocalTimerServer", "LocalTimerClient",
    "TimerClient", "TimerRequest", "Expiry", "configure", "expires", "WatchPolicy",
    # events and statistics
    "TimerEvent", "TimerAcquired", "TimerReleased", "TimerExpired", "TimerReaped",
    "ProcessExited", "RequestRejected", "RejectReason", "TimerServerStatistics",
    # errors
    "TimerError", "NoTimerClientError", "TimerServerUnavailableError", "RequestTooLargeError",
    "TimerConfigError", "ScopeExpiredError", "InvalidDurationError",
    # the pure cores
    "DeadlineHeap", "Timer", "LineDecoder", "Rejection", "encode_request", "decode_line",
    "PIPE_BUF",
    # learned timeouts
    "LearnedTimeouts", "LearnedScope", "LearningPolicy", "learned_limits", "read_learned",
}  # fmt: skip


def test_all_is_exactly_the_intended_surface() -> None:
    """__all__ lists each intended name once, and each is importable."""
    assert set(timer.__all__) == EXPECTED
    assert len(timer.__all__) == len(EXPECTED)
    assert all(hasattr(timer, name) for name in timer.__all__)


def test_public_classes_live_in_private_modules() -> None:
    """Public classes and functions are implemented in private ``_module`` files."""
    for name in timer.__all__:
        obj = getattr(timer, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__.startswith("aioelastic.timer._"), (name, obj.__module__)
