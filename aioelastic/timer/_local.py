"""The in-process watchdog: ``LocalTimerServer`` and its ``LocalTimerClient`` over a memory channel.

For code that runs its workers as tasks rather than processes. Requests travel over an anyio
memory channel; reaping an expired ``async with expires(...)`` block cancels that block, which
then raises :class:`ScopeExpiredError`. Synchronous blocks (``with``) are reported, not
interrupted. Events carry this process's pid and signal 0.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.lowlevel import EventLoopToken, current_token
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioelastic._clock import Clock
from aioelastic.timer._api import TimerClient
from aioelastic.timer._codec import Rejection, TimerRequest
from aioelastic.timer._events import TimerExpired, TimerReaped
from aioelastic.timer._heap import Timer, TimerKey
from aioelastic.timer._server import EventCallback, LogEvent, TimerServerBase, as_request


@dataclass(frozen=True, slots=True)
class _LocalRequest:
    request: TimerRequest
    cancel: Callable[[], None] | None


class LocalTimerServer(TimerServerBase):
    """A timer server for this process's own tasks; clients come from :meth:`client`."""

    def __init__(
        self,
        run_id: str = "",
        log_event: LogEvent | None = None,
        *,
        on_event: EventCallback | None = None,
        clock: Clock | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            run_id, log_event=log_event, on_event=on_event, clock=clock, wall_clock=wall_clock
        )
        self._send: MemoryObjectSendStream[_LocalRequest] | None = None
        self._receive: MemoryObjectReceiveStream[_LocalRequest] | None = None
        self._cancels: dict[TimerKey, Callable[[], None]] = {}

    def client(self) -> LocalTimerClient:
        """A client bound to this server; call it while serving, in the event loop's thread."""
        if self._send is None:
            raise RuntimeError("LocalTimerServer.client() needs the server to be serving")
        return LocalTimerClient(self._send, current_token())

    def _open_source(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[_LocalRequest](math.inf)

    async def _serve_requests(self) -> None:
        assert self._receive is not None
        await self._serve_forever(self._receive)

    def _close_source(self) -> None:
        for stream in (self._send, self._receive):
            if stream is not None:
                stream.close()
        self._send = self._receive = None

    async def _serve_forever(self, receive: MemoryObjectReceiveStream[_LocalRequest]) -> None:
        while True:
            batch = [await receive.receive()]
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except anyio.WouldBlock:
                    break
            for item in batch:
                key = (item.request.pid, item.request.scope_id)
                if item.cancel is None:
                    self._cancels.pop(key, None)
                else:
                    self._cancels[key] = item.cancel
            requests = [item.request for item in batch]
            self._apply([(r.pid, r.scope_id, r.expiration_time, r.signal) for r in requests])

    def _admit(self, pid: int) -> Rejection | None:
        return None

    def _on_expired(self, timer: Timer, expired: TimerExpired) -> None:
        cancel = self._cancels.pop(timer.key, None)
        if cancel is None:
            return
        cancel()
        self._reaped += 1
        self._emit(TimerReaped(timer.pid, timer.scope_id, 0, timer.deadline, timer.expiration_time))
        self._log("kill worker process", as_request(timer))


class LocalTimerClient(TimerClient):
    """Sends this task's timer requests to a :class:`LocalTimerServer`."""

    def __init__(self, send: MemoryObjectSendStream[_LocalRequest], token: EventLoopToken) -> None:
        self._send_stream = send
        self._token = token
        self._loop_thread = threading.get_ident()
        self._pid = os.getpid()

    async def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._put(TimerRequest(self._pid, scope_id, expiration_time), None)

    async def acquire_cancellable(
        self, scope_id: str, expiration_time: float, cancel: Callable[[], None]
    ) -> None:
        self._put(TimerRequest(self._pid, scope_id, expiration_time), cancel)

    async def release(self, scope_id: str) -> None:
        self._put(TimerRequest(self._pid, scope_id, -1), None)

    def acquire_sync(self, scope_id: str, expiration_time: float) -> None:
        self._put(TimerRequest(self._pid, scope_id, expiration_time), None)

    def release_sync(self, scope_id: str) -> None:
        self._put(TimerRequest(self._pid, scope_id, -1), None)

    def _put(self, request: TimerRequest, cancel: Callable[[], None] | None) -> None:
        item = _LocalRequest(request, cancel)
        if threading.get_ident() == self._loop_thread:
            self._send_stream.send_nowait(item)
        else:
            anyio.from_thread.run_sync(self._send_stream.send_nowait, item, token=self._token)
