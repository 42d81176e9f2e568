"""FileTimerClient: atomic requests, and clear errors when no server reads the FIFO."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from aioelastic.timer import (
    PIPE_BUF,
    FileTimerClient,
    InvalidDurationError,
    LineDecoder,
    RequestTooLargeError,
    TimerRequest,
    TimerServerUnavailableError,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    path = str(tmp_path / "timer.fifo")
    os.mkfifo(path, 0o600)
    return path


@pytest.fixture
def reader(fifo: str) -> Iterator[int]:
    """A bare reader on the FIFO that the test drains by hand."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    yield fd
    os.close(fd)


def drain(fd: int) -> list[object]:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return list(LineDecoder().feed(data))


async def test_acquire_and_release_write_torchs_lines(fifo: str, reader: int) -> None:
    """Acquire carries the client's signal; release is expiration -1 with signal 0."""
    client = FileTimerClient(fifo, signal=signal.SIGTERM)
    await client.acquire("step", 1234.5)
    await client.release("step")
    pid = os.getpid()
    assert drain(reader) == [
        TimerRequest(pid, "step", 1234.5, signal.SIGTERM),
        TimerRequest(pid, "step", -1.0, 0),
    ]


def test_sync_methods_write_the_same_lines(fifo: str, reader: int) -> None:
    """The synchronous forms send exactly what the async ones do."""
    client = FileTimerClient(fifo)
    client.acquire_sync("s", 10.0)
    client.release_sync("s")
    assert drain(reader) == [
        TimerRequest(os.getpid(), "s", 10.0, signal.SIGKILL),
        TimerRequest(os.getpid(), "s", -1.0, 0),
    ]


async def test_missing_fifo_is_reported_after_the_retry_window(tmp_path: Path) -> None:
    """Without a FIFO the client gives up after connect_timeout and names the path."""
    client = FileTimerClient(tmp_path / "absent", connect_timeout=0)
    with pytest.raises(TimerServerUnavailableError, match=r"no timer server is reading .*absent"):
        await client.acquire("s", 10.0)


async def test_fifo_without_reader_is_a_broken_pipe(fifo: str) -> None:
    """A FIFO nobody reads raises a BrokenPipeError subclass saying so."""
    client = FileTimerClient(fifo, connect_timeout=0)
    with pytest.raises(BrokenPipeError, match="nobody has it open for reading"):
        await client.release("s")


def test_sync_send_without_server_raises_too(fifo: str) -> None:
    """The synchronous form fails the same way."""
    client = FileTimerClient(fifo, connect_timeout=0)
    with pytest.raises(TimerServerUnavailableError, match="start a FileTimerServer"):
        client.acquire_sync("s", 10.0)


async def test_regular_file_is_not_written(tmp_path: Path) -> None:
    """A regular file at the path is refused and left unchanged."""
    path = tmp_path / "plain"
    path.write_bytes(b"")
    client = FileTimerClient(path, connect_timeout=0)
    with pytest.raises(TimerServerUnavailableError, match="it is not a FIFO"):
        await client.acquire("s", 10.0)
    assert path.read_bytes() == b""


async def test_full_pipe_is_reported(fifo: str, reader: int) -> None:
    """When the server stops reading and the pipe fills, the client says the pipe is full."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    client = FileTimerClient(fifo, connect_timeout=0)
    with pytest.raises(TimerServerUnavailableError, match="the pipe is full"):
        await client.acquire("s", 10.0)


async def test_oversized_request_is_refused_before_sending(fifo: str, reader: int) -> None:
    """A request over PIPE_BUF raises and writes nothing."""
    client = FileTimerClient(fifo)
    with pytest.raises(RequestTooLargeError, match=r"over the 4096-byte atomic pipe write limit"):
        await client.acquire("x" * PIPE_BUF, 10.0)
    assert drain(reader) == []


async def test_largest_request_that_fits_is_sent(fifo: str, reader: int) -> None:
    """A request of exactly PIPE_BUF bytes (newline included) goes through intact."""
    client = FileTimerClient(fifo)
    overhead = len(client._encode("", 10.0, 9))
    scope = "y" * (PIPE_BUF - overhead)
    await client.acquire(scope, 10.0)
    assert drain(reader) == [TimerRequest(os.getpid(), scope, 10.0, 9)]


async def test_non_finite_expiration_is_refused(fifo: str, reader: int) -> None:
    """An infinite or NaN expiration time raises before anything is written."""
    client = FileTimerClient(fifo)
    with pytest.raises(InvalidDurationError, match="expiration_time must be a finite"):
        await client.acquire("s", float("inf"))
    assert drain(reader) == []
