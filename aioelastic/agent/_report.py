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
    """Return the human report of a failed job, root cause (first failure) first."""
    host = host or socket.gethostname()
    ordered = sorted(failures, key=lambda f: f.timestamp)
    rule = "=" * 72
    lines = [rule, f"{title} FAILED", "-" * 72]
    for index, failure in enumerate(ordered):
        heading = "root cause (first failure)" if index == 0 else "also failed"
        when = datetime.fromtimestamp(failure.timestamp).isoformat(sep=" ", timespec="seconds")
        lines += [
            f"{heading}: rank {failure.rank} (local rank {failure.local_rank})",
            f"  host      : {host}",
            f"  time      : {when}",
            f"  pid       : {failure.pid}",
            f"  ended     : {failure.cause}",
        ]
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
