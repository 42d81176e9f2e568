"""One worker process: started in its own session, watched and signalled through a pidfd.

Why this shape (see ``platform-facts.md``): a pidfd becomes readable when the process exits,
on every event loop, with no thread per child (asyncio 3.11's default child watcher would
start one); signalling through it cannot hit a recycled pid. Each worker leads its own
session, so its process group holds its grandchildren too: ``killpg`` reaches them. When the
worker exits, its group is killed *before* the worker is reaped, while the zombie still pins
the group id, so no recycled group is ever signalled.

A worker also dies with the agent, even on ``kill -9``: it starts through util-linux's
``setpriv --pdeathsig KILL``, which sets ``PR_SET_PDEATHSIG`` and execs the worker in the same
process. Doing it with a ``preexec_fn`` instead would force ``fork()`` (slower than the
``vfork()`` subprocess uses) and run other libraries' fork handlers in the child, which crash
with gRPC threads running (the etcd backend). Without ``setpriv`` workers start unprotected (a
warning says so). An agent killed in the instant between starting ``setpriv`` and its
``prctl`` call can still leave that one worker behind.

The parent-death signal covers one generation: what a worker started survives it. The agent's
:class:`~aioelastic.agent._guardian.Guardian` covers them: a worker's group is registered with
it once started and unregistered right after the final ``killpg`` (zombie still unreaped).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import IO, TYPE_CHECKING

import anyio

from aioelastic.agent._errors import WorkerSpawnError
from aioelastic.agent._guardian import Guardian

if TYPE_CHECKING:
    from aioelastic.agent._template import Template

logger = logging.getLogger(__name__)

Redirect = int | IO[bytes] | None
"""A child's stdout/stderr: inherit (None), ``subprocess.DEVNULL``, a file descriptor or file."""


@functools.cache
def die_with_agent_prefix() -> tuple[str, ...]:
    """The command prefix making a worker die with the agent, or ``()`` where unavailable."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is not None:
        prefix = (setpriv, "--pdeathsig", "KILL", "--")
        probe = subprocess.run(  # util-linux before 2.33 has no --pdeathsig
            [*prefix, setpriv, "--version"], capture_output=True, check=False
        )
        if probe.returncode == 0:
            return prefix
    logger.warning(
        "no setpriv with --pdeathsig (util-linux >= 2.33): workers will outlive an agent "
        "killed with SIGKILL; install util-linux to protect them"
    )
    return ()


class WorkerProcess:
    """A started worker: its pid, its pidfd, its exit status once known.

    Started plainly (``popen``) or forked by the agent's fork template (``pid`` and
    ``template``, which reaps it and relays its status: see ``_template.py``).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | None,
        guardian: Guardian | None = None,
        *,
        pid: int | None = None,
        template: Template | None = None,
    ) -> None:
        self._popen = popen
        if popen is not None:
            pid = popen.pid
        assert pid is not None, "a worker is a Popen or a forked pid"
        self._pid: int = pid
        self._template = template
        self._returncode: int | None = None
        self._group_killed = False
        """The final SIGKILL went to the group: its id may be freed from now on."""
        self._pidfd: int | None = os.pidfd_open(self._pid)
        self._exited = anyio.Event()
        self._guardian = guardian
        if guardian is not None:
            guardian.register(self._pid)

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stdin: Redirect = subprocess.DEVNULL,
        stdout: Redirect = None,
        stderr: Redirect = None,
        cwd: str | None = None,
        guardian: Guardian | None = None,
        pass_fds: Sequence[int] = (),
        template: Template | None = None,
    ) -> WorkerProcess:
        """Start ``argv`` in a new session with ``env``; raise :class:`WorkerSpawnError`.

        ``stdin`` is ``/dev/null`` unless given (``None``: the agent's own, a terminal say).

        ``guardian`` (the agent's) is told about the worker's group while it may run;
        ``pass_fds`` stay open in the worker under the same numbers. With a ready
        ``template`` (``--preload``) the worker is forked from it instead of started.
        """
        announced = False
        if template is not None and cwd is None:
            if guardian is not None:
                env, announced = guardian.spawning(env), True
            pid = _forked(template, argv, env, stdin, stdout, stderr, pass_fds)
            if pid is not None:
                return cls(None, guardian, pid=pid, template=template)
        program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if program is None:  # checked here: behind setpriv, exec errors would be exit codes
            raise WorkerSpawnError(
                list(argv), FileNotFoundError(2, "not found or not executable", argv[0])
            )
        try:
            popen = subprocess.Popen(
                [*die_with_agent_prefix(), program, *argv[1:]],
                env=dict(env) if guardian is None or announced else guardian.spawning(env),
                cwd=cwd,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            )
        except OSError as exc:
            raise WorkerSpawnError(list(argv), exc) from exc
        return cls(popen, guardian)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def forked(self) -> bool:
        """Whether the worker is a fork of the agent's template (``--preload``)."""
        return self._popen is None

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped: the exit code, or minus the signal that killed it."""
        return self._popen.returncode if self._popen is not None else self._returncode

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the worker and every process of its group, unless it is reaped."""
        if self.returncode is None and not self._group_killed:
            with suppress(ProcessLookupError):
                os.killpg(self._pid, signum)

    async def watch(self) -> int:
        """Wait for the worker to exit, kill what is left of its group, reap it; return status.

        Exactly one task calls this; others use :meth:`wait`.
        """
        assert self._pidfd is not None, "watch() runs once per worker"
        try:
            await anyio.wait_readable(self._pidfd)
        finally:
            if not self._exited.is_set():
                with anyio.CancelScope(shield=True):
                    await self._reap()
        return self._final_status()

    def _final_status(self) -> int:
        code = self.returncode
        assert code is not None, "reaped"
        return code

    async def _reap(self) -> None:
        pidfd, self._pidfd = self._pidfd, None
        assert pidfd is not None
        with suppress(ProcessLookupError):  # leader is a zombie at most: pgid still pinned
            os.killpg(self._pid, signal.SIGKILL)
        self._group_killed = True
        if self._guardian is not None:  # the whole group is dying: never signal that id again
            self._guardian.unregister(self._pid)
        await anyio.wait_readable(pidfd)
        os.close(pidfd)
        if self._popen is not None:
            self._popen.wait()
        else:
            assert self._template is not None
            self._returncode = await self._template.reap(self._pid)
        self._exited.set()

    async def wait(self) -> int:
        """Return the exit status once :meth:`watch` has reaped the worker."""
        await self._exited.wait()
        return self._final_status()

    def __repr__(self) -> str:
        return f"WorkerProcess(pid={self.pid}, returncode={self.returncode})"


def _forked(
    template: Template,
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: Redirect,
    stdout: Redirect,
    stderr: Redirect,
    pass_fds: Sequence[int],
) -> int | None:
    """Fork ``argv`` from ``template``; None when it must be started plainly."""
    from aioelastic.agent._template_command import python_command

    try:
        command = python_command(argv)
    except ValueError as exc:
        logger.info("worker %s is started plainly: %s", list(argv), exc)
        return None
    return template.fork(command, env, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds)
