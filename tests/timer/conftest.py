"""Fixtures for the timer tests: an event recorder, real sleeper processes, raw FIFO writes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import pytest

from aioelastic.timer import TimerEvent, TimerRequest, encode_request

E = TypeVar("E", bound=TimerEvent)
Spawn = Callable[..., "subprocess.Popen[bytes]"]

GENEROUS = 60.0
"""Bound (s) on waits for real processes; generous because the machine is shared and slow."""


class Recorder:
    """Collects a server's events; tests wait on conditions over them instead of sleeping."""

    def __init__(self) -> None:
        self.events: list[TimerEvent] = []
        self._waiters: list[anyio.Event] = []

    def __call__(self, event: TimerEvent) -> None:
        self.events.append(event)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set()

    def of(self, kind: type[E]) -> list[E]:
        """The recorded events of one type, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(self, condition: Callable[[], bool], timeout: float = GENEROUS) -> None:
        """Return once ``condition()`` holds, re-checking after each event."""
        with anyio.fail_after(timeout):
            while not condition():
                waiter = anyio.Event()
                self._waiters.append(waiter)
                await waiter.wait()

    async def wait_count(self, kind: type[E], count: int) -> list[E]:
        """Wait until ``count`` events of ``kind`` were recorded; return them."""
        await self.wait_for(lambda: len(self.of(kind)) >= count)
        return self.of(kind)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


SLEEPER = "import sys; sys.stdin.read()"


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start real Python processes (killed and reaped at teardown)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str = SLEEPER, *args: str, **options: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **options,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait (without a thread or a poll loop) until ``proc`` exits; return its exit code."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        with anyio.fail_after(GENEROUS):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return proc.wait()


async def read_line(proc: subprocess.Popen[bytes]) -> bytes:
    """The next line ``proc`` prints (read in a worker thread, bounded)."""
    assert proc.stdout is not None
    with anyio.fail_after(GENEROUS):
        return await anyio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)


def arm(path: str, pid: int, scope: str, expiration_time: float, signal: int = 9) -> None:
    """Write one version-1 acquire (or release, when ``expiration_time < 0``) for ``pid``."""
    write_raw(path, encode_request(TimerRequest(pid, scope, expiration_time, signal)))


def write_raw(path: str, data: bytes) -> None:
    """Write ``data`` to the FIFO in one ``os.write``, as a (possibly misbehaving) client."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
