"""Helpers for agent tests: the scenario worker, a console that can be waited on, pid checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

WORKER = str(Path(__file__).parent / "workers" / "scenario.py")
BOUND = 60
"""Generous bound (seconds) for anything involving real processes on a loaded 2-core machine."""


class Console:
    """A binary stream standing in for the agent's stdout/stderr; tests wait for text on it."""

    def __init__(self) -> None:
        self.data = b""
        self._changed = anyio.Event()

    def write(self, data: bytes) -> int:
        self.data += data
        self._changed.set()
        self._changed = anyio.Event()
        return len(data)

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return self.data.decode()

    async def wait_for(self, text: str, count: int = 1) -> None:
        """Return once ``text`` appeared ``count`` times."""
        while self.text.count(text) < count:
            await self._changed.wait()


def pids_in(text: str) -> list[int]:
    """Every pid the scenario worker reported (``pids`` lines, after any rank prefix)."""
    found = []
    for line in text.splitlines():
        _, sep, rest = line.partition("pids ")
        if sep:
            found += [int(p) for p in rest.split()]
    return found


async def wait_gone(pid: int) -> None:
    """Return once process ``pid`` (any process) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def python_worker(*args: str) -> tuple[str, tuple[str, ...]]:
    """The (entrypoint, args) pair running the scenario worker with ``args``."""
    return sys.executable, ("-u", WORKER, *args)
