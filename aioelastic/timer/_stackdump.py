"""Worker side of the stack capture: a signal on which ``faulthandler`` dumps every thread.

The agent tells its workers ``AIOELASTIC_STACK_SIGNAL`` (a signal number) and
``AIOELASTIC_STACK_DIR``. When a worker configures a timer client, it registers that signal
with :mod:`faulthandler`, writing to ``<dir>/<pid>.stack``; the file's existence tells the
agent the signal is safe to send (an unregistered signal could kill the worker). It is the
agent's fallback when py-spy cannot attach; the dump is written by C code in the signal
handler, so it works while the main thread is blocked in C.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Mapping
from typing import IO

STACK_SIGNAL_ENV = "AIOELASTIC_STACK_SIGNAL"
STACK_DIR_ENV = "AIOELASTIC_STACK_DIR"

_registered: tuple[int, IO[bytes]] | None = None
"""(pid, file) of this process's registration; the file must stay open for faulthandler."""


def stack_file(directory: str, pid: int) -> str:
    """Where worker ``pid`` dumps its stacks."""
    return os.path.join(directory, f"{pid}.stack")


def register_stack_dump(environ: Mapping[str, str] = os.environ) -> str | None:
    """Register the agent's stack signal with faulthandler (once per process); return the file.

    Does nothing (returns None) outside an agent that asked for it.
    """
    global _registered
    signum, directory = environ.get(STACK_SIGNAL_ENV), environ.get(STACK_DIR_ENV)
    if not signum or not directory:
        return None
    pid = os.getpid()
    path = stack_file(directory, pid)
    if _registered is not None and _registered[0] == pid:
        return path
    try:
        dump = open(path, "ab", buffering=0)  # noqa: SIM115  # kept open for faulthandler
        faulthandler.register(int(signum), file=dump, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return None  # no fallback then: the agent says why it has no stack
    _registered = (pid, dump)
    return path
