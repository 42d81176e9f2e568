"""The FIFO watchdog's client, ``FileTimerClient``: works with our server and with PyTorch's."""

from __future__ import annotations

import errno
import math
import os
import signal as _signal
import stat
import time

import anyio

from aioelastic.timer._api import TimerClient
from aioelastic.timer._codec import PIPE_BUF, TimerRequest, encode_request
from aioelastic.timer._errors import (
    InvalidDurationError,
    RequestTooLargeError,
    TimerServerUnavailableError,
)


class FileTimerClient(TimerClient):
    """Sends this process's timer requests to a :class:`FileTimerServer` (or PyTorch's).

    Each request is one atomic write on a FIFO opened write-only and non-blocking, then closed
    (PyTorch's server needs the close to see the line promptly). When no server reads the FIFO
    the client retries for ``connect_timeout`` seconds, then raises
    :class:`TimerServerUnavailableError`.
    """

    def __init__(
        self,
        file_path: str | os.PathLike[str],
        signal: int = _signal.SIGKILL,
        *,
        connect_timeout: float = 1.0,
        retry_interval: float = 0.05,
    ) -> None:
        self.file_path = os.fspath(file_path)
        self.signal = int(signal)
        self.connect_timeout = connect_timeout
        self.retry_interval = retry_interval

    def __repr__(self) -> str:
        return f"FileTimerClient({self.file_path!r}, signal={self.signal})"

    async def acquire(self, scope_id: str, expiration_time: float) -> None:
        await self._send(self._encode(scope_id, expiration_time, self.signal))

    async def release(self, scope_id: str) -> None:
        await self._send(self._encode(scope_id, -1, 0))

    def acquire_sync(self, scope_id: str, expiration_time: float) -> None:
        self._send_sync(self._encode(scope_id, expiration_time, self.signal))

    def release_sync(self, scope_id: str) -> None:
        self._send_sync(self._encode(scope_id, -1, 0))

    def _encode(self, scope_id: str, expiration_time: float, signum: int) -> bytes:
        if not math.isfinite(expiration_time):
            raise InvalidDurationError("expiration_time", expiration_time)
        line = encode_request(TimerRequest(os.getpid(), scope_id, expiration_time, signum))
        if len(line) > PIPE_BUF:
            raise RequestTooLargeError(len(line), PIPE_BUF, scope_id)
        return line

    def _try_write(self, line: bytes) -> str | None:
        """Write ``line`` in one go; on failure, say why."""
        try:
            fd = os.open(self.file_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return "the FIFO does not exist"
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return "nobody has it open for reading"
            return f"cannot open it: {exc.strerror}"
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return "it is not a FIFO"
            os.write(fd, line)
        except BlockingIOError:
            return "the pipe is full (the server is not reading)"
        except BrokenPipeError:
            return "the reader went away"
        finally:
            os.close(fd)
        return None

    async def _send(self, line: bytes) -> None:
        start = time.monotonic()
        while (reason := self._try_write(line)) is not None:
            waited = time.monotonic() - start
            if waited >= self.connect_timeout:
                raise TimerServerUnavailableError(self.file_path, waited, reason)
            await anyio.sleep(self.retry_interval)

    def _send_sync(self, line: bytes) -> None:
        start = time.monotonic()
        while (reason := self._try_write(line)) is not None:
            waited = time.monotonic() - start
            if waited >= self.connect_timeout:
                raise TimerServerUnavailableError(self.file_path, waited, reason)
            time.sleep(self.retry_interval)
