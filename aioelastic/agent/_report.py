"""The report the launcher prints when a job fails, and what a worker's error file says.

A failure record (:class:`WorkerFailure`, kept with the other event types in
``aioelastic/_kinds/failures.py`` and re-exported here) joins what the agent saw (exit code or
signal, and the watchdog scope when the timer server reaped the worker) with what the worker
wrote to its error file (``aioelastic.errors`` or torch's ``record``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from aioelastic._kinds.failures import HangReport, StackRecord, WorkerFailure, signal_name

__all__ = [
    "HangReport",
    "StackRecord",
    "WorkerFailure",
    "format_report",
    "read_error_file",
    "root_cause_first",
    "signal_name",
]


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
