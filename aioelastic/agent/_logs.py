"""Workers' output: where each stream goes, and the pump that prefixes lines with the rank.

A stream that only goes to a file is handed to the worker as that file (no copying); one that
reaches the console goes through a pipe the agent reads without threads, prefixing each line
and, with ``tee``, copying the raw bytes to the file as well.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
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


def plan_streams(
    logs: LogSpec, local_rank: int, attempt_dir: Path | None
) -> tuple[StreamPlan, StreamPlan]:
    """Return the (stdout, stderr) plans of ``local_rank``; files live in ``attempt_dir``."""
    redirects = std_for(logs.redirects, local_rank)
    tee = std_for(logs.tee, local_rank)
    shown = logs.local_ranks_filter is None or local_rank in logs.local_ranks_filter
    plans = []
    for stream, name in ((Std.OUT, "stdout.log"), (Std.ERR, "stderr.log")):
        to_file = bool((redirects | tee) & stream) and attempt_dir is not None
        console = shown and (not redirects & stream or bool(tee & stream))
        path = attempt_dir / str(local_rank) / name if to_file and attempt_dir else None
        plans.append(StreamPlan(console=console, file=path))
    return plans[0], plans[1]


def line_prefix(template: str, *, rank: int, local_rank: int, role_name: str) -> bytes:
    """Expand a console prefix template for one worker."""
    text = Template(template).safe_substitute(rank=rank, local_rank=local_rank, role_name=role_name)
    return text.encode()


class StreamPump:
    """Copies one worker stream from a pipe to the console (line by line, prefixed) and a file."""

    def __init__(
        self,
        read_fd: int,
        *,
        prefix: bytes,
        console: Callable[[bytes], None] | None,
        file: IO[bytes] | None,
    ) -> None:
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        self._prefix = prefix
        self._console = console
        self._file = file
        self._partial = b""

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
            if self._partial:
                self._emit(self._prefix + self._partial + b"\n")
            os.close(self._fd)
            if self._file is not None:
                self._file.close()

    def _feed(self, chunk: bytes) -> None:
        if self._file is not None:
            self._file.write(chunk)
            self._file.flush()
        if self._console is None:
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) >= _CHUNK:  # a very long line: show it in pieces
            lines.append(self._partial)
            self._partial = b""
        if lines:
            self._emit(b"".join(self._prefix + line + b"\n" for line in lines))

    def _emit(self, data: bytes) -> None:
        if self._console is None:
            return
        try:
            self._console(data)
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
    plan: StreamPlan, *, prefix: bytes, console: Callable[[bytes], None]
) -> OpenedStream:
    """Create what a worker stream needs: an inherited fd, a file, a pipe with a pump, or null."""
    file: IO[bytes] | None = None
    if plan.file is not None:
        plan.file.parent.mkdir(parents=True, exist_ok=True)
        file = plan.file.open("ab")
    if not plan.console:
        return OpenedStream(subprocess.DEVNULL if file is None else file, None)
    if file is None and not prefix:
        return OpenedStream(None, None)
    read_fd, write_fd = os.pipe()
    return OpenedStream(write_fd, StreamPump(read_fd, prefix=prefix, console=console, file=file))


def console_writer(stream: IO[bytes]) -> Callable[[bytes], None]:
    """Return a sink that writes whole chunks to ``stream`` and flushes them."""

    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write
