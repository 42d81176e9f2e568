"""The guardian program: kill the worker process groups an agent leaves behind when it dies.

Run as a script (``python -I -S _guardian_main.py GRACE TOKEN``) by
:class:`~aioelastic.agent._guardian.Guardian`. Start-up is its whole cost, so it imports only
built-in modules: ``posix`` rather than ``os`` and no ``signal`` (whose ``enum`` import alone
would double it). Its stdin is a pipe from the agent carrying one line per message::

    *       a worker is being started (its group id is not known yet)
    +PGID   a worker started: its process group PGID is the agent's
    -PGID   the agent killed group PGID itself: never signal it again
    bye     the agent is exiting cleanly: exit without signalling anything

When the pipe reaches end-of-file without ``bye``, the agent died (SIGKILL, OOM kill). The
guardian then sends SIGTERM to every group still registered and to every process whose
environment carries the agent's TOKEN (``AIOELASTIC_GUARDIAN_TOKEN``, given to each worker and
inherited by what it starts): that covers a worker the agent died before registering (its
``setpriv`` may also have armed the parent-death signal too late) and processes that left
their worker's group. It waits up to GRACE seconds for all of them to exit, SIGKILLs what is
left, scanning again until no carrier remains, and exits. Carriers are found through
``/proc/PID/environ`` and signalled through a pidfd opened before the check, so a recycled pid
is never signalled.

:class:`Registry` is the pure part (bytes in, the groups to signal out); :func:`main` is the
I/O around it.
"""

from __future__ import annotations

import posix
import sys
import time

BYE = b"bye\n"
SPAWNING = b"*\n"
SPAWN_SETTLE = 2.0
"""How long a guardian whose agent died while starting a worker keeps looking for it."""
TOKEN_VARIABLE = "AIOELASTIC_GUARDIAN_TOKEN"
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
        self.spawning = 0
        """Workers being started whose group was not registered yet."""
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
        if line == SPAWNING[:-1]:
            self.spawning += 1
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
            self.spawning = max(0, self.spawning - 1)
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


def carriers(token_entry: bytes) -> dict[int, int]:
    """A pidfd for each live process whose environment holds ``token_entry`` (``NAME=value``)."""
    found: dict[int, int] = {}
    for name in posix.listdir("/proc"):
        if name.isdigit() and int(name) != posix.getpid() and _carries(name, token_entry):
            try:
                pidfd = posix.pidfd_open(int(name))
            except OSError:
                continue
            if _carries(name, token_entry):  # still the same process: its pidfd is safe to use
                found[int(name)] = pidfd
            else:
                posix.close(pidfd)
    return found


def _carries(pid: str, token_entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return token_entry in environ.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def stop_all(groups: frozenset[int], token_entry: bytes, grace: float, *, spawning: bool) -> None:
    """SIGTERM the groups and token carriers; after ``grace`` seconds SIGKILL what is left.

    While ``grace`` runs, new carriers are looked for too; if a worker was being started, for at
    least :data:`SPAWN_SETTLE` seconds (until it execs, its environment is still the agent's).
    """
    import select  # here, once the agent died: start-up stays light
    import signal

    def signal_carriers(pidfds: dict[int, int], signum: int) -> None:
        for pidfd in pidfds.values():
            try:
                signal.pidfd_send_signal(pidfd, signum)
            except ProcessLookupError:
                continue

    def running(pidfds: dict[int, int]) -> dict[int, int]:
        ended, _, _ = select.select(list(pidfds.values()), [], [], 0)
        for pidfd in ended:
            posix.close(pidfd)
        return {pid: fd for pid, fd in pidfds.items() if fd not in ended}

    def scan(found: dict[int, int]) -> dict[int, int]:
        if not token_entry:
            return found
        new = carriers(token_entry)
        for pid in new.keys() & found.keys():
            posix.close(new.pop(pid))
        signal_carriers(new, SIGTERM)
        return {**found, **new}

    start = time.monotonic()
    settle = start + (SPAWN_SETTLE if spawning else 0.0)
    deadline = max(start + grace, settle)
    alive = signal_groups(groups, SIGTERM)
    found = scan({})
    while (alive or found or time.monotonic() < settle) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        alive = signal_groups(alive, 0)
        found = scan(running(found))
    signal_groups(alive, SIGKILL)
    while found:  # until a scan finds no carrier: what they started meanwhile is found too
        signal_carriers(found, SIGKILL)
        select.select(list(found.values()), [], [], 1.0)
        for pidfd in found.values():
            posix.close(pidfd)
        found = carriers(token_entry) if token_entry else {}


def main(argv: list[str]) -> int:
    """Follow the agent's messages on stdin until ``bye`` or end-of-file (see the module doc)."""
    grace = float(argv[1]) if len(argv) > 1 else 5.0
    token = argv[2] if len(argv) > 2 else ""
    registry = Registry()
    while not registry.said_bye:
        data = posix.read(0, 4096)
        if not data:
            break
        registry.feed(data)
    if not registry.said_bye:
        token_entry = f"{TOKEN_VARIABLE}={token}".encode() if token else b""
        stop_all(registry.to_signal(), token_entry, grace, spawning=registry.spawning > 0)
    return 0


if __name__ == "__main__":
    posix._exit(main(sys.argv))  # nothing to flush: skip finalization, the agent waits for this
