"""Which processes a timer server may signal: fixed safety rules plus a watch policy.

The safety rules are not configurable: never pid <= 1, never the server's own process, never
the leader of its process group. On top, a :class:`WatchPolicy` says which processes the
server watches at all (default: processes of the server's own user). Both are checked once per
process, at its first acquire, against the pidfd opened for it, so the answer stays about that
process even if its pid is later recycled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass


def forbidden_reason(pid: int, *, own_pid: int, own_pgid: int) -> str | None:
    """Why ``pid`` may never be signalled by a server running as ``own_pid``/``own_pgid``."""
    if pid <= 1:
        return f"pid {pid} is never signalled (pid <= 1)"
    if pid == own_pid:
        return f"pid {pid} is the timer server's own process"
    if pid == own_pgid:
        return f"pid {pid} leads the timer server's own process group"
    return None


def _proc_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    raise ProcessLookupError(pid)


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        data = stat.read()
    # The command name may contain spaces and parentheses; the fields after it do not.
    return int(data[data.rindex(b")") + 2 :].split()[1])


@dataclass(frozen=True, slots=True)
class WatchPolicy:
    """Decides whether a process may be watched (and so signalled); see the constructors."""

    description: str
    _allows: Callable[[int], str | None]

    @classmethod
    def same_user(cls) -> WatchPolicy:
        """Processes whose real user is the server's effective user (the default)."""
        uid = os.geteuid()

        def allows(pid: int) -> str | None:
            other = _proc_uid(pid)
            return None if other == uid else f"pid {pid} runs as uid {other}, not {uid}"

        return cls(f"same user (uid {uid})", allows)

    @classmethod
    def pids(cls, pids: Iterable[int]) -> WatchPolicy:
        """Exactly these pids (for example the workers an agent launched)."""
        allowed = frozenset(pids)

        def allows(pid: int) -> str | None:
            return None if pid in allowed else f"pid {pid} is not in the watched set"

        return cls(f"pids {sorted(allowed)}", allows)

    @classmethod
    def descendants_of(cls, ancestor: int) -> WatchPolicy:
        """Processes whose parent chain reaches ``ancestor`` (children, grandchildren...)."""

        def allows(pid: int) -> str | None:
            current = pid
            while current > 1:
                current = _parent_pid(current)
                if current == ancestor:
                    return None
            return f"pid {pid} does not descend from pid {ancestor}"

        return cls(f"descendants of pid {ancestor}", allows)

    def check(self, pid: int) -> str | None:
        """``None`` if ``pid`` may be watched, else why not (reads ``/proc``)."""
        try:
            return self._allows(pid)
        except (OSError, ValueError, IndexError) as exc:
            return f"cannot inspect pid {pid}: {exc}"
