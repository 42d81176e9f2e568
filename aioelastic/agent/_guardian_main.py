"""The guardian program: kill the worker process groups an agent leaves behind when it dies.

Run as a script (``python -I -S _guardian_main.py GRACE``) by
:class:`~aioelastic.agent._guardian.Guardian`. Start-up is its whole cost, so it imports only
built-in modules: ``posix`` rather than ``os`` and no ``signal`` (whose ``enum`` import alone
would double it). Its stdin is a pipe from the agent carrying one line per message::

    +PGID   a worker started: its process group PGID is the agent's
    -PGID   the agent killed group PGID itself: never signal it again
    bye     the agent is exiting cleanly: exit without signalling anything

When the pipe reaches end-of-file without ``bye``, the agent died (SIGKILL, OOM kill). The
guardian then sends SIGTERM to every group still registered, waits up to GRACE seconds for
them to empty (checking every few milliseconds), SIGKILLs what is left and exits.

:class:`Registry` is the pure part (bytes in, the groups to signal out); :func:`main` is the
I/O around it.
"""

from __future__ import annotations

import posix
import sys
import time

BYE = b"bye\n"
MAX_PGID = 2**22
"""Linux's largest possible pid (``PID_MAX_LIMIT`` on 64-bit); larger ids are malformed."""
SIGKILL, SIGTERM = 9, 15  # the same on every Linux architecture (and fixed by POSIX's XSI)
POLL_INTERVAL = 0.02
"""How often a dying guardian checks whether the groups it sent SIGTERM to are empty."""


def register_line(pgid: int) -> bytes:
    """The message registering process group ``pgid``."""
    return b"+%d\n" % pgid


def unregister_line(pgid: int) -> bytes:
    """The message unregistering process group ``pgid``."""
    return b"-%d\n" % pgid


class Registry:
    """The groups the agent registered and has not unregistered, fed the pipe's bytes.

    Pure: no I/O. A malformed line changes nothing (it is counted in ``rejected``): only an id
    the agent explicitly registered can ever be signalled. Lines after ``bye`` are ignored.
    """

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.said_bye = False
        self.rejected = 0
        self._partial = b""

    def feed(self, data: bytes) -> None:
        """Apply every complete line of ``data`` (a partial last line waits for the rest)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._apply(line)

    def to_signal(self) -> frozenset[int]:
        """The groups to signal now that the pipe has ended: none after ``bye``."""
        return frozenset() if self.said_bye else frozenset(self.groups)

    def _apply(self, line: bytes) -> None:
        if self.said_bye:
            return
        if line == BYE[:-1]:
            self.said_bye = True
            return
        op, digits = line[:1], line[1:]
        if op not in (b"+", b"-") or not digits.isdigit() or len(digits) > 8:
            self.rejected += 1
            return
        pgid = int(digits)
        if not 1 < pgid <= MAX_PGID:  # 0 is "my own group", 1 is init's
            self.rejected += 1
        elif op == b"+":
            self.groups.add(pgid)
        else:
            self.groups.discard(pgid)


def signal_groups(groups: set[int] | frozenset[int], signum: int) -> set[int]:
    """Send ``signum`` (0: just probe) to each group; return the groups that still exist."""
    alive = set()
    for pgid in groups:
        try:
            posix.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            continue  # empty, or taken over by a setuid program: nothing this guardian may do
        alive.add(pgid)
    return alive


def stop_groups(groups: frozenset[int], grace: float) -> None:
    """SIGTERM ``groups``, wait up to ``grace`` seconds for them to empty, SIGKILL the rest."""
    alive = signal_groups(groups, SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        alive = signal_groups(alive, 0)
    signal_groups(alive, SIGKILL)


def main(argv: list[str]) -> int:
    """Follow the agent's messages on stdin until ``bye`` or end-of-file (see the module doc)."""
    grace = float(argv[1]) if len(argv) > 1 else 5.0
    registry = Registry()
    while not registry.said_bye:
        data = posix.read(0, 4096)
        if not data:
            break
        registry.feed(data)
    stop_groups(registry.to_signal(), grace)
    return 0


if __name__ == "__main__":
    posix._exit(main(sys.argv))  # nothing to flush: skip finalization, the agent waits for this
