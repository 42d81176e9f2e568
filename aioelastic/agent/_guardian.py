"""The agent's guardian: what the workers started dies with the agent, even on ``kill -9``.

Why: a worker dies with its agent through the parent-death signal (see ``_process.py``), but
that covers one generation. What the worker started (data loaders, servers, a ``sleep``)
would survive both, orphaned to init. On a normal stop the agent ``killpg``s each worker's
process group, which holds those grandchildren; an agent killed outright cannot.

So each agent starts one guardian: a small program (``_guardian_main.py``, built-in modules
only, run with ``python -I -S``) reading a pipe from the agent. Spawning it costs the agent
about 0.4 ms; its own start-up (about 10 ms of CPU) runs on another core, and ``aioelastic
run`` starts it before importing the agent so that it overlaps with those imports. The agent
registers each worker's process group as the worker starts and unregisters it right after its
own SIGKILL to the group, while the worker's unreaped zombie still pins the group id. Each
worker also carries the agent's random token in ``AIOELASTIC_GUARDIAN_TOKEN`` (inherited by
what it starts). When the pipe ends without a clean ``bye``, the agent is dead: the guardian
SIGTERMs every group still registered and every process carrying the token, and SIGKILLs what
is left after the grace period (``shutdown_timeout``). The token covers the worker the agent
was starting when it died (announced with ``*`` but not registered; its ``setpriv`` may have
armed the parent-death signal too late) and processes that left their worker's group.

Shape: the guardian is not tied to the agent by a parent-death signal (outliving it is its
job); it leads its own session, so a terminal's Ctrl-C or a signal to the agent's process
group does not reach it; its stdout and stderr are /dev/null, so it never holds the agent's
output pipes open; the pipe's write end is close-on-exec, so no worker holds it either.

Limits: a process that both leaves its worker's group (``setsid()``, ``setpgid()``) and drops
the token from its environment escapes; so does one started after the guardian's last scan by
a process it could not see. Only a cgroup per agent (a systemd scope, a container) contains
everything. Group ids are only ever signalled while registered; a
recycled id could be hit only if the agent dies between its own SIGKILL to a group and the
unregister line, and the id is reused within the guardian's reaction. If the guardian cannot
start, or dies, the agent warns and runs on without it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Self

import anyio
from anyio.abc import AsyncResource

from aioelastic.agent._guardian_main import (
    BYE,
    SPAWNING,
    TOKEN_VARIABLE,
    register_line,
    unregister_line,
)

logger = logging.getLogger(__name__)

PROGRAM = str(Path(__file__).with_name("_guardian_main.py"))
EXIT_TIMEOUT = 5.0
"""How long a clean agent exit waits for its guardian to leave before killing it."""

_UNPROTECTED = "processes started by workers will outlive an agent killed with SIGKILL"


@asynccontextmanager
async def guardian_for(given: Guardian | None, *, grace: float) -> AsyncIterator[Guardian]:
    """``given`` as it is (its owner closes it), or a guardian of our own for the block."""
    if given is not None:
        yield given
        return
    async with Guardian(grace=grace) as own:
        yield own


class Guardian(AsyncResource):
    """The agent side of the guardian: register groups, say goodbye, reap it.

    ``async with Guardian(grace=...) as guardian:`` starts it (or warns and runs without);
    leaving the block says ``bye`` and waits for it to exit.
    """

    def __init__(self, *, grace: float) -> None:
        self.grace = grace
        self.token = os.urandom(8).hex()
        """Given to each worker as ``AIOELASTIC_GUARDIAN_TOKEN``: marks what is the agent's."""
        self._process: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._pipe: int | None = None

    @property
    def pid(self) -> int | None:
        """The guardian's pid while it runs (None if it could not start)."""
        return None if self._process is None else self._process.pid

    @property
    def active(self) -> bool:
        """Whether registered groups are protected (the guardian runs and reads its pipe)."""
        return self._pipe is not None

    def start(self) -> None:
        """Start the guardian process; on failure log a warning and carry on without it."""
        try:
            self._pipe = self._spawn()
        except (OSError, ValueError) as exc:  # ValueError: sys.executable is empty
            logger.warning("could not start the agent's guardian (%s): %s", exc, _UNPROTECTED)

    def _spawn(self) -> int:
        read_end, write_end = os.pipe()  # not inheritable: only the guardian's stdin is passed
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", PROGRAM, repr(self.grace), self.token],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
            )
            self._pidfd = os.pidfd_open(self._process.pid)
        except BaseException:
            os.close(write_end)
            if self._process is not None:  # pidfd_open failed: never leave it running
                self._process.kill()
                self._process.wait()
                self._process = None
            raise
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        return write_end

    def spawning(self, env: Mapping[str, str]) -> dict[str, str]:
        """Announce a worker about to start; return its ``env`` with the agent's token."""
        self._send(SPAWNING)
        return {**env, TOKEN_VARIABLE: self.token}

    def register(self, pgid: int) -> None:
        """Protect process group ``pgid`` (a worker that just started)."""
        self._send(register_line(pgid))

    def unregister(self, pgid: int) -> None:
        """Forget ``pgid``: the agent has SIGKILLed the group and will reap its leader."""
        self._send(unregister_line(pgid))

    def _send(self, line: bytes) -> None:
        if self._pipe is None:
            return
        try:
            os.write(self._pipe, line)  # shorter than PIPE_BUF: all or nothing
        except OSError as exc:  # EPIPE: it died; EAGAIN: it stopped reading (SIGSTOP?)
            logger.warning(
                "the agent's guardian (pid %s) stopped reading (%s): %s",
                self.pid,
                exc,
                _UNPROTECTED,
            )
            self._abandon()

    def _abandon(self) -> None:
        """Kill the guardian before closing the pipe: it must not act on a partial picture."""
        if self._pidfd is not None:
            with suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None

    async def aclose(self) -> None:
        """Say ``bye`` and wait (bounded) for the guardian to exit; reap it."""
        if self._pipe is not None:
            with suppress(OSError):
                os.write(self._pipe, BYE)
            os.close(self._pipe)
            self._pipe = None
        pidfd, self._pidfd = self._pidfd, None
        process, self._process = self._process, None
        if pidfd is None or process is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(EXIT_TIMEOUT):
                    await anyio.wait_readable(pidfd)
                if process.poll() is None:
                    logger.warning(
                        "the agent's guardian (pid %s) did not exit: killed", process.pid
                    )
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    await anyio.wait_readable(pidfd)
                process.wait()
        finally:
            os.close(pidfd)

    async def __aenter__(self) -> Self:
        self.start()
        return self
