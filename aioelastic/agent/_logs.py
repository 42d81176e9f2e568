"""Workers' output: where each stream goes, and the pump that prefixes lines with the rank.

A stream that only goes to a file is handed to the worker as that file (no copying). One that
goes only to the console is, under ``aioelastic run``, the agent's own (inherited, so a terminal
stays a terminal, as under torchrun). One that reaches the console through the agent (``tee``,
or a console given as a Python stream) goes through a pipe the agent reads without threads,
prefixing each line and, with ``tee``, copying the raw bytes to the file as well. A partial
line (a ``\r`` progress bar, a prompt) is shown at once, not held until its newline.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import IO

import anyio

from aioelastic.agent._process import Redirect
from aioelastic.agent._spec import LogSpec, Std, std_for

_CHUNK = 65536

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """Where one stream of one worker goes: the console (prefixed), a file, both or nowhere."""

    console: bool
    file: Path | None
    inherit: bool = False
    """Console only, and the worker writes to the agent's own stream directly (no relay)."""


def plan_streams(
    logs: LogSpec, local_rank: int, attempt_dir: Path | None, *, directory: str | None = None
) -> tuple[StreamPlan, StreamPlan]:
    """Return the (stdout, stderr) plans of ``local_rank``; files live in ``attempt_dir``,
    under ``directory`` (default: the local rank; a spare's own, as it holds none)."""
    redirects = std_for(logs.redirects, local_rank)
    tee = std_for(logs.tee, local_rank)
    shown = logs.local_ranks_filter is None or local_rank in logs.local_ranks_filter
    plans = []
    for stream, name in ((Std.OUT, "stdout.log"), (Std.ERR, "stderr.log")):
        to_file = bool((redirects | tee) & stream) and attempt_dir is not None
        console = shown and (not redirects & stream or bool(tee & stream))
        folder = str(local_rank) if directory is None else directory
        path = attempt_dir / folder / name if to_file and attempt_dir else None
        inherit = console and path is None and (logs.inherit_console or not logs.line_prefix)
        plans.append(StreamPlan(console=console, file=path, inherit=inherit))
    return plans[0], plans[1]


def make_run_log_dir(log_dir: str | None, run_id: str) -> Path:
    """Create this run's own log directory: ``<log_dir>/<run_id>_<random>`` (torchrun's
    layout), so a re-run with the same id never appends to an earlier run's files. Without
    ``log_dir``, the base is a new temporary directory."""
    base = log_dir or tempfile.mkdtemp(prefix="aioelastic-logs-")
    Path(base).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{run_id}_", dir=base))


def line_prefix(template: str, *, rank: int | str, local_rank: int | str, role_name: str) -> bytes:
    """Expand a console prefix template for one worker."""
    text = Template(template).safe_substitute(rank=rank, local_rank=local_rank, role_name=role_name)
    return text.encode()


_LINE_ENDS = re.compile(rb"([\r\n])")


def prefix_lines(data: bytes, prefix: bytes, at_line_start: bool) -> tuple[bytes, bool]:
    """Put ``prefix`` before the first byte of each line in ``data``; return it and whether
    the next byte starts a line.

    A line starts after ``\n`` and after ``\r`` (so each redraw of a progress bar keeps its
    prefix); ``\r\n`` is one line end. ``at_line_start`` carries the state between chunks.
    """
    if not prefix:
        return data, data.endswith((b"\n", b"\r")) if data else at_line_start
    out = []
    for piece in _LINE_ENDS.split(data):
        if not piece:
            continue
        if piece in (b"\n", b"\r"):
            out.append(piece)
            at_line_start = True
            continue
        if at_line_start:
            out.append(prefix)
        out.append(piece)
        at_line_start = False
    return b"".join(out), at_line_start


class SharedConsole:
    """One console written by many pumps: a line one worker left open (a prompt, a progress
    bar) is ended before another worker's output, which then shows on a line of its own."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self._open_line: StreamPump | None = None

    def write(self, pump: StreamPump, data: bytes, *, line_open: bool) -> None:
        """Show ``data`` from ``pump``; ``line_open``: it ends inside a line."""
        owner = self._open_line
        if owner is not None and owner is not pump:
            owner.line_ended_by_others()
            data = b"\n" + data
        self._open_line = pump if line_open else None
        self._write(data)


class FilteredCopy:
    """One attempt's copy of the tee'd lines (every rank's, prefixed) that contain any of
    ``needles``: torchrun's ``--duplicate-stdout-filters``/``--duplicate-stderr-filters``."""

    def __init__(self, path: Path, needles: Sequence[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        self._needles = [needle.encode() for needle in needles if needle]

    def add_line(self, prefix: bytes, line: bytes) -> None:
        """Keep ``line`` (without its newline) if it matches a filter."""
        if any(needle in line for needle in self._needles):
            self._file.write(prefix + line + b"\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class StreamPump:
    """Copies one worker stream from a pipe to the console (prefixed, as it comes) and a file."""

    def __init__(
        self,
        read_fd: int,
        *,
        prefix: bytes,
        console: SharedConsole | None,
        file: IO[bytes] | None,
        duplicate: FilteredCopy | None = None,
    ) -> None:
        os.set_blocking(read_fd, False)
        self._duplicate = duplicate
        self._unmatched = b""  # the line the filtered copy has not seen the end of
        self._fd = read_fd
        self._prefix = prefix
        self._console = console
        self._file = file
        self._at_line_start = True

    async def run(self) -> None:
        """Copy until every writer closed the pipe; then flush and close."""
        try:
            while True:
                try:
                    chunk = os.read(self._fd, _CHUNK)
                except BlockingIOError:
                    await anyio.wait_readable(self._fd)
                    continue
                if not chunk:
                    break
                self._feed(chunk)
        finally:
            if not self._at_line_start:  # end the last line: what follows starts afresh
                self._emit(b"\n")
            if self._duplicate is not None and self._unmatched:
                self._duplicate.add_line(self._prefix, self._unmatched)
            os.close(self._fd)
            if self._file is not None:
                self._file.close()

    def _feed(self, chunk: bytes) -> None:
        if self._file is not None:
            self._file.write(chunk)
            self._file.flush()
        if self._duplicate is not None:
            *lines, self._unmatched = (self._unmatched + chunk).split(b"\n")
            for line in lines:
                self._duplicate.add_line(self._prefix, line)
        if self._console is None:
            return
        shown, self._at_line_start = prefix_lines(chunk, self._prefix, self._at_line_start)
        self._emit(shown)

    def retitle(self, prefix: bytes) -> None:
        """Prefix the lines from now on with ``prefix`` (a spare placed, a rank changed)."""
        self._prefix = prefix

    def line_ended_by_others(self) -> None:
        """Another worker's output ended this stream's open line: prefix the next byte anew."""
        self._at_line_start = True

    def _emit(self, data: bytes) -> None:
        if self._console is None:
            return
        try:
            self._console.write(self, data, line_open=not self._at_line_start)
        except OSError as exc:  # the console went away (a closed pipe): keep draining the worker
            logger.warning("worker output no longer shown: %s", exc)
            self._console = None


@dataclass(slots=True)
class OpenedStream:
    """A stream ready for spawning: what the child gets, and the pump to run if any."""

    child_end: Redirect
    pump: StreamPump | None

    def after_spawn(self) -> None:
        """Close the agent's copy of what was handed to the child."""
        if isinstance(self.child_end, int) and self.child_end >= 0:
            os.close(self.child_end)
        elif self.child_end is not None and not isinstance(self.child_end, int):
            self.child_end.close()


def open_stream(
    plan: StreamPlan,
    *,
    prefix: bytes,
    console: SharedConsole,
    duplicate: FilteredCopy | None = None,
) -> OpenedStream:
    """Create what a worker stream needs: an inherited fd, a file, a pipe with a pump, or null.

    ``duplicate`` gets the matching lines of a tee'd stream (console and file)."""
    file: IO[bytes] | None = None
    if plan.file is not None:
        plan.file.parent.mkdir(parents=True, exist_ok=True)
        file = plan.file.open("ab")
    if not plan.console:
        return OpenedStream(subprocess.DEVNULL if file is None else file, None)
    if plan.inherit:
        return OpenedStream(None, None)
    read_fd, write_fd = os.pipe()
    tee_copy = duplicate if file is not None else None
    pump = StreamPump(read_fd, prefix=prefix, console=console, file=file, duplicate=tee_copy)
    return OpenedStream(write_fd, pump)


def console_writer(stream: IO[bytes]) -> SharedConsole:
    """Return the console of ``stream``: whole chunks written and flushed."""

    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return SharedConsole(write)
