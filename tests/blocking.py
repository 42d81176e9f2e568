"""A guard for the test suite: calls that may block, made on a thread running an event loop.

While installed, the guard wraps the standard library's name lookups (``socket.getaddrinfo``
and friends, ``socket.getfqdn``) and ``time.sleep``. A wrapped call made on a thread that runs
an asyncio (or uvloop) or trio loop, with arguments that may block (a host name rather than a
numeric address, a sleep longer than zero), is recorded with where it came from; the call
itself goes ahead unchanged, so the code under test behaves as it would without the guard. The
suite's autouse fixture fails every test that recorded one. Calls from worker threads
(``anyio.to_thread``, the loop's executor) are what the loop should do instead, and pass.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = __file__
ROOT = str(Path(__file__).resolve().parent.parent) + os.sep
_INSIDE = threading.local()
"""Set while a guarded call runs: the calls it makes itself, or a nested guard's, pass."""


def _numeric(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        ipaddress.ip_address(str(host).partition("%")[0])
    except ValueError:
        return False
    return True


def _getaddrinfo_may_block(host: object, *args: Any, **kwargs: Any) -> bool:
    flags = kwargs.get("flags", args[4] if len(args) > 4 else 0)
    return not (_numeric(host) or flags & socket.AI_NUMERICHOST)


def _host_may_block(host: object = None, *_: Any, **__: Any) -> bool:
    return not _numeric(host)


def _always(*_: Any, **__: Any) -> bool:
    return True


def _sleep_may_block(seconds: float, *_: Any, **__: Any) -> bool:
    return seconds > 0


GUARDED: dict[tuple[Any, str], Callable[..., bool]] = {
    (socket, "getaddrinfo"): _getaddrinfo_may_block,
    (socket, "gethostbyname"): _host_may_block,
    (socket, "gethostbyname_ex"): _host_may_block,
    (socket, "gethostbyaddr"): _always,
    (socket, "getnameinfo"): _always,
    (socket, "getfqdn"): _always,
    (time, "sleep"): _sleep_may_block,
}
"""(module, function) -> whether a call with these arguments may block."""


def on_event_loop() -> bool:
    """Whether this thread is running an asyncio or trio event loop right now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        trio = sys.modules.get("trio")
        return trio is not None and bool(trio.lowlevel.in_trio_run())
    return True


class BlockingCalls:
    """Records the blocking calls made on an event loop while :meth:`installed`."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def _wrap(self, name: str, real: Callable[..., Any], may_block: Callable[..., bool]) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if getattr(_INSIDE, "active", False):  # getfqdn calls gethostbyaddr: one record
                return real(*args, **kwargs)
            _INSIDE.active = True
            try:
                if on_event_loop() and may_block(*args, **kwargs):
                    entry = f"{name}() on the event loop, from {_caller()}"
                    if entry not in self.found:  # a polling loop says it once
                        self.found.append(entry)
                return real(*args, **kwargs)
            finally:
                _INSIDE.active = False

        return guarded

    @contextmanager
    def installed(self) -> Iterator[BlockingCalls]:
        """Wrap the guarded functions for the block; put the real ones back after it."""
        originals = {key: getattr(*key) for key in GUARDED}
        for (module, attr), may_block in GUARDED.items():
            name = f"{module.__name__}.{attr}"
            setattr(module, attr, self._wrap(name, originals[(module, attr)], may_block))
        try:
            yield self
        finally:
            for (module, attr), real in originals.items():
                setattr(module, attr, real)


def _caller() -> str:
    """The innermost two frames of the project (the package or its tests) that led here."""
    frames = [
        f"{frame.filename.removeprefix(ROOT)}:{frame.lineno} ({frame.name})"
        for frame in traceback.extract_stack()
        if frame.filename.startswith(ROOT) and frame.filename != HERE
    ]
    return " <- ".join(reversed(frames[-2:])) or "outside the project"
