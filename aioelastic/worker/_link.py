"""The worker's end of its link to the agent: a socket, what arrived on it, and waiting.

Sync methods never block unless they say ``wait``; the async twins wait on the event loop
(the socket's readability), so an async worker needs no thread.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections import deque

import anyio

from aioelastic.worker._protocol import (
    WORKER_FD_ENV,
    LineDecoder,
    Message,
    NoMoreWorlds,
    StillValid,
    Warm,
    WorldAssigned,
    WorldEnded,
    encode,
)


class AgentLinkError(Exception):
    """The link to the agent broke (the agent is gone) or was never set up."""


class Link:
    """What the agent told this worker so far (see the module docstring)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._decoder = LineDecoder()
        self._polling = threading.Lock()
        self._reading: anyio.Event | None = None
        self.assigned: deque[WorldAssigned] = deque()
        self.ended: dict[int, str] = {}
        self.valid: set[int] = set()
        self.no_more: str | None = None
        self.newest = 0
        self.warm: list[str] = []
        """Modules the agent asked this process (an idle spare) to import, not imported yet."""

    @classmethod
    def from_env(cls) -> Link | None:
        """The link the agent set up for this process, if it did (``AIOELASTIC_WORKER_FD``)."""
        raw = os.environ.get(WORKER_FD_ENV)
        if not raw:
            return None
        try:
            fd = int(raw)
            sock = socket.socket(fileno=fd)
        except (ValueError, OSError) as exc:
            raise AgentLinkError(
                f"{WORKER_FD_ENV}={raw!r} is not this process's link to its agent ({exc}); "
                "was the variable copied from another process's environment?"
            ) from None
        os.environ.pop(WORKER_FD_ENV)  # a child of this worker must not think it is linked
        return cls(sock)

    @property
    def socket(self) -> socket.socket:
        """The link's socket (readable when the agent said something)."""
        return self._sock

    # -- sending and receiving -------------------------------------------------------------------

    def send(self, message: Message) -> None:
        data = encode(message)
        while data:
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                select.select([], [self._sock], [])
                continue
            except OSError as exc:
                raise AgentLinkError(f"the agent is gone ({exc})") from None
            data = data[sent:]

    def poll(self) -> None:
        """Take in whatever arrived, without waiting (from any thread: a world's store wait
        in a worker's thread checks its world too)."""
        with self._polling:
            while True:
                try:
                    data = self._sock.recv(65536)
                except BlockingIOError:
                    return
                except OSError as exc:
                    raise AgentLinkError(f"the agent is gone ({exc})") from None
                if not data:
                    raise AgentLinkError("the agent closed the link (it is stopping or gone)")
                for message in self._decoder.feed(data):
                    self._note(message)

    def _note(self, message: Message) -> None:
        match message:
            case WorldAssigned():
                self.assigned.append(message)
                self.newest = max(self.newest, message.generation)
            case WorldEnded():
                self.ended[message.generation] = message.reason
            case StillValid():
                self.valid.add(message.generation)
            case NoMoreWorlds():
                self.no_more = message.reason
            case Warm():
                self.warm.extend(message.names)
            case _:
                raise AgentLinkError(f"the agent sent a worker's message: {message}")

    def wait(self, timeout: float | None = None) -> None:
        """Block until something arrives (or ``timeout`` seconds pass), then take it in."""
        select.select([self._sock], [], [], timeout)
        self.poll()

    async def wait_async(self) -> None:
        """Wait on the event loop until something arrives, then take it in. Any number of
        tasks may wait: one reads the socket, the others wake when it has (the loop allows
        one waiter per socket)."""
        reading = self._reading
        if reading is not None:
            await reading.wait()
            return
        reading = self._reading = anyio.Event()
        try:
            await anyio.wait_readable(self._sock)
            self.poll()
        finally:
            self._reading = None
            reading.set()

    # -- what it means --------------------------------------------------------------------------

    def end_of(self, generation: int) -> str | None:
        """Why ``generation`` ended, or None while it is still the worker's world."""
        if generation in self.ended:
            return self.ended[generation]
        if self.newest > generation:
            return f"generation {self.newest} was assigned"
        if self.no_more is not None:
            return self.no_more
        return None

    def next_world(self) -> WorldAssigned | None:
        """The first queued world that did not end (older, ended ones are dropped), or None."""
        while self.assigned:
            world = self.assigned.popleft()
            if self.end_of(world.generation) is None:
                return world
        return None

    def close(self) -> None:
        self._sock.close()
