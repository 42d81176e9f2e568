"""What a failed worker leaves behind, as data: its failure record and the stacks captured.

The agent fills these in (``aioelastic/agent/_group.py``, ``_forensics.py``); its events carry
them (``WorkerFailed``, ``StacksCaptured``), and the views below the agent read them.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal 64`` for a number without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True, slots=True)
class StackRecord:
    """One rank's capture: how it was taken, where it was written, or why there is none."""

    rank: int
    pid: int
    method: str | None
    """``py-spy``, ``faulthandler``, or None when no stack could be taken."""
    stack_file: str | None = None
    place: str | None = None
    """Where its main thread was (``waiting in all_reduce``, ``stuck in data.py:88 f``)."""
    reason: str | None = None
    """Why there is no stack (or why py-spy was not used), when that happened."""
    core_file: str | None = None
    core_reason: str | None = None


@dataclass(frozen=True, slots=True)
class HangReport:
    """What the agent captured when a watchdog timer expired, before reaping."""

    scope_id: str
    rank: int
    """The rank whose timer expired first."""
    directory: str
    """Where the stack files are (``--log-dir`` or a temporary directory)."""
    summary: str
    """``rank 3 stuck in data.py:88 load_batch; ranks 0-2 and 4-7 waiting in all_reduce``."""
    suspects: tuple[int, ...]
    stacks: tuple[StackRecord, ...]

    def for_pid(self, pid: int) -> StackRecord | None:
        """The capture of local worker ``pid``, if it was one of those captured."""
        return next((s for s in self.stacks if s.pid == pid), None)


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """One worker that failed: where it ran, how it ended, and what it reported."""

    local_rank: int
    rank: int
    pid: int
    returncode: int
    timestamp: float
    """Unix time the agent saw the failure."""
    error_file: str
    message: str | None = None
    traceback: str | None = None
    reaped_scope: str | None = None
    """The watchdog scope whose expiry got the worker killed, if that is how it ended."""
    stack: StackRecord | None = None
    """Its stack, captured before the reap (or why there is none)."""
    hang: HangReport | None = None
    """The stacks of every rank captured at the same moment, grouped."""

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that ended the worker, if one did."""
        return None if self.returncode >= 0 else signal_name(-self.returncode)

    @property
    def cause(self) -> str:
        """A short phrase saying how the worker ended."""
        if self.reaped_scope is not None:
            how = self.signal_name or f"exit code {self.returncode}"
            return f"reaped by the watchdog ({how}): timer {self.reaped_scope!r} expired"
        if self.signal_name is not None:
            return f"killed by {self.signal_name}"
        return f"exit code {self.returncode}"
