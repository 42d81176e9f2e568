"""Failure records and the report the launcher prints when a job fails.

A record joins what the agent saw (exit code or signal, and the watchdog scope when the timer
server reaped the worker) with what the worker wrote to its error file (``aioelastic.errors``
or torch's ``record``).
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


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


def read_error_file(path: str) -> tuple[str | None, str | None]:
    """Return (message, traceback) from a worker's error file; (None, None) when there is none.

    Accepts torch's layout (``message`` holding ``message`` and ``extraInfo.py_callstack``) and a
    plain ``{"message": "..."}``; anything unreadable becomes a message saying so.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return f"<error file {path} unreadable: {exc}>", None
    try:
        data = json.loads(text)
        body = data["message"]
        if isinstance(body, str):
            return body, None
        extra = body.get("extraInfo", {})
        return str(body.get("message")), extra.get("py_callstack")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"<error file {path} is not in torch's layout: {exc}>", None


def format_report(title: str, failures: Sequence[WorkerFailure], *, host: str | None = None) -> str:
    """Return the human report of a failed job, root cause first: the suspect of a hang the
    watchdog's stack capture named, else the first failure."""
    host = host or socket.gethostname()
    ordered = root_cause_first(failures)
    rule = "=" * 72
    lines = [rule, f"{title} FAILED", "-" * 72]
    hangs_shown: list[HangReport] = []
    for index, failure in enumerate(ordered):
        heading = "also failed"
        if index == 0:
            heading = (
                "root cause ("
                + ("the hang's suspect" if _suspected(failure) else "first failure")
                + ")"
            )
        when = datetime.fromtimestamp(failure.timestamp).isoformat(sep=" ", timespec="seconds")
        lines += [
            f"{heading}: rank {failure.rank} (local rank {failure.local_rank})",
            f"  host      : {host}",
            f"  time      : {when}",
            f"  pid       : {failure.pid}",
            f"  ended     : {failure.cause}",
        ]
        lines += _hang_lines(failure, show_hang=failure.hang not in hangs_shown)
        if failure.hang is not None:
            hangs_shown.append(failure.hang)
        if failure.message:
            lines.append(f"  error     : {failure.message}")
        if failure.traceback:
            lines.append("  traceback :")
            lines += [f"    {line}" for line in failure.traceback.rstrip().splitlines()]
        elif not failure.message:
            lines.append(
                "  traceback : none recorded (decorate the entry point with "
                "aioelastic.errors.record to get one)"
            )
    lines.append(rule)
    return "\n".join(lines)


def root_cause_first(failures: Sequence[WorkerFailure]) -> list[WorkerFailure]:
    """``failures`` with the root cause first: a hang's suspect, else the earliest failure."""
    return sorted(failures, key=lambda f: (not _suspected(f), f.timestamp))


def _suspected(failure: WorkerFailure) -> bool:
    return failure.hang is not None and failure.rank in failure.hang.suspects


def _hang_lines(failure: WorkerFailure, *, show_hang: bool) -> list[str]:
    """The report's lines about the stacks captured before a reap (the grouping only once)."""
    lines = []
    if failure.hang is not None and show_hang:
        lines.append(f"  hang      : {failure.hang.summary}")
        suspects = ", ".join(map(str, failure.hang.suspects)) or "none"
        lines.append(f"  suspects  : {suspects} (stacks in {failure.hang.directory})")
    stack = failure.stack
    if stack is not None:
        if stack.stack_file is not None:
            lines.append(f"  stack     : {stack.stack_file} ({stack.method})")
        else:
            lines.append(f"  stack     : none ({stack.reason})")
        if stack.core_file is not None:
            lines.append(f"  core      : {stack.core_file}")
        elif stack.core_reason is not None:
            lines.append(f"  core      : none ({stack.core_reason})")
    return lines
