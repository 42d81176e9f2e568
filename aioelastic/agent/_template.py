"""The agent's fork template (``aioelastic run --preload``): workers forked from a warm process.

Why: a worker started plainly imports its modules (``import torch`` alone takes seconds, and
minutes on a cold shared filesystem at scale) on every start: job start, restart, in-place
replacement, new spare. With ``--preload MODULES`` the agent starts one template per node that
imports them once and then only forks; every worker of that node is a fork of it.

Shape: the template is exec'd (``python [options] _template_main.py``, through ``setpriv
--pdeathsig`` like a worker, so it dies with the agent), never forked from the threaded agent.
It runs the workers' interpreter with their options and their environment (less the ranks),
and reads ``sys.path[0]`` as they would. The agent talks to it over a ``SOCK_SEQPACKET``
socketpair (``_template_codec.py``): it passes each worker's stdin, stdout, stderr and passed
descriptors as ``SCM_RIGHTS``. The agent supervises each worker as one it started itself: a
pidfd (it works on a grandchild), signals to its process group, the guardian's registration.
Only the exit status needs the parent: once the agent has killed the worker's group (the zombie
still pins the group id), it asks the template to reap it and relay the status.

A fork is a short blocking request (the agent starts plain workers with a blocking ``Popen``
too); the other requests are awaited. While the template imports more modules
(:meth:`Template.import_modules`), or while a new one starts, workers start plainly. A
template that dies (its workers die with it: the parent-death signal) is restarted, up to
:data:`MAX_RESTARTS` times; then, or when a new one cannot preload, the rest of the run starts
workers plainly. Each of those is a :class:`~aioelastic.agent._events.TemplateLost` event.
Modules that cannot be preloaded at the start fail the launch (:class:`PreloadError`): the
job never silently runs without them.

Learning (``--fork-template auto``, the default): the agent tells :meth:`Template.learn` what
its workers had loaded (``_learned.py``; local rank 0 of the plainly started workers records
its imports in :attr:`Template.imports`, see :meth:`Template.recording_env`), and the template
imports it leniently (a failing import is skipped, one that would start a thread left out, in
``_template_main.learn_all``; a few thousand names go in requests of :data:`LEARN_BYTES`).
Without ``--preload`` the template starts only then, so the first workers start plainly, as
torchrun's do, and the later ones (restart, replacement, spare) fork from a warm process. A
replacement template imports the learned modules again.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self

import anyio
from anyio.abc import TaskGroup

from aioelastic._imports_file import IMPORTS_FILE_ENV
from aioelastic.agent import _template_codec as codec
from aioelastic.agent._errors import AgentError
from aioelastic.agent._events import AgentEvent, TemplateLearned, TemplateLost, TemplateReady
from aioelastic.agent._guardian import Guardian
from aioelastic.agent._guardian_main import TOKEN_VARIABLE
from aioelastic.agent._learned import ImportsFile, worth_a_template
from aioelastic.agent._site import loads_worker_site, without_worker_site
from aioelastic.agent._template_checks import script_path0
from aioelastic.agent._template_codec import check_module_names
from aioelastic.agent._template_command import PythonCommand, python_command, template_env

if TYPE_CHECKING:
    from aioelastic.agent._spec import WorkerSpec

logger = logging.getLogger(__name__)

PROGRAM = str(Path(__file__).with_name("_template_main.py"))
MAX_RESTARTS = 3
"""How many times a template that died is replaced before workers start plainly for good."""
REPLY_TIMEOUT = 30.0
"""How long a fork may take before the template is taken for hung (and killed)."""
EXIT_TIMEOUT = 5.0
"""How long closing waits for the template to leave before killing it."""
DYING_BOUND = 1.0
"""How long a fork request waits for a template whose socket closed to exit (it blocks)."""
LEARN_BYTES = 64 * 1024
"""The most bytes of names one request to import learned modules carries (a worker may have
loaded thousands; a packet on the control socket holds about 200 KB)."""

Redirect = int | IO[bytes] | None


class PreloadError(AgentError):
    """The modules given to ``--preload`` cannot be preloaded safely; the message says why and
    what to do."""

    def __init__(self, modules: Sequence[str], reason: str) -> None:
        self.modules = tuple(modules)
        self.reason = reason
        super().__init__(f"--preload {','.join(modules)}: {reason}")


@dataclass(frozen=True, slots=True)
class TemplateStatistics:
    """A snapshot of a :class:`Template`: its pid (None: none running), modules, the workers
    forked and started plainly, the templates started (the first and its replacements)."""

    pid: int | None
    modules: tuple[str, ...]
    forks: int
    plain_starts: int
    starts: int
    learned: tuple[str, ...] = ()


class _Process:
    """One template process and its end of the control socket."""

    def __init__(self, popen: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.popen = popen
        self.control = control
        self.started = time.monotonic()
        self.ready = False
        self.learned: set[str] = set()
        """The learned names this process was asked to import."""
        self.reading = anyio.CancelScope()
        """Cancelled when the agent gives this template up: its reader closes the socket."""

    def kill(self) -> None:
        if self.popen.poll() is None:
            with suppress(ProcessLookupError):
                self.popen.kill()


class Template:
    """The agent side of one node's fork template (see the module docstring).

    ``async with Template(command, modules, ...) as template:`` starts it (its imports run
    while the agent rendezvouses); :meth:`wait_ready` waits for them; :meth:`fork` starts a
    worker (None: start it plainly); :meth:`reap` relays an exited worker's status;
    :meth:`import_modules` preloads more.
    """

    def __init__(
        self,
        command: PythonCommand,
        modules: Sequence[str],
        *,
        learn: bool = False,
        env: Mapping[str, str],
        emit: Callable[[AgentEvent], None],
        guardian: Guardian | None = None,
        prefix: Sequence[str] = (),
        max_restarts: int = MAX_RESTARTS,
        imports_file: str | None = None,
    ) -> None:
        self.command = command
        self.modules = check_module_names(modules)
        """The modules named to preload (and :meth:`import_modules`): they must import."""
        self.learned: tuple[str, ...] = ()
        """What of the names :meth:`learn` was told the template holds (not those whose
        import failed, or would start a thread)."""
        self._learning = learn
        self.imports = ImportsFile(imports_file) if learn and imports_file else None
        """Where local rank 0 of the plainly started workers records its imports (learning)."""
        self._preloading = bool(self.modules)
        self._wanted: dict[str, None] = {}
        self._rejected: set[str] = set()
        self._wake_learner = anyio.Event()
        """Set when more is wanted, or a new template started (it has nothing learned yet)."""
        self._env = dict(env) if guardian is None else {**env, TOKEN_VARIABLE: guardian.token}
        self._emit = emit
        self._prefix = tuple(prefix)
        self._restarts_left = max_restarts
        self._process: _Process | None = None
        self._starts = 0
        self._next_id = 1
        self._replies: dict[int, codec.Reply] = {}
        self._waiting: set[int] = set()
        self._importing = False
        self._arrived = anyio.Event()
        self._tg: TaskGroup | None = None
        self._first_answer: codec.Reply | None = None
        self.seed = int.from_bytes(os.urandom(8), "big") >> 1
        """The job seed each child's random streams derive from (with its rank and restart)."""
        self.forks = 0
        self.plain_starts = 0

    # -- life ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running template's pid (None while there is none)."""
        return None if self._process is None else self._process.popen.pid

    def statistics(self) -> TemplateStatistics:
        """A snapshot of the counters."""
        return TemplateStatistics(
            self.pid, self.modules, self.forks, self.plain_starts, self._starts, self.learned
        )

    @property
    def learning(self) -> bool:
        """Whether :meth:`learn` imports what it is told (``--fork-template auto``)."""
        return self._learning

    def recording_env(self, local_rank: int, env: Mapping[str, str]) -> dict[str, str]:
        """What a worker's environment ``env`` gets so that, started plainly, it records its
        imports for :meth:`learn` (local rank 0 only: the node's workers run one script; a
        worker forked from the template records nothing, see :meth:`fork`)."""
        if self.imports is None or local_rank != 0 or not loads_worker_site(env):
            return {}
        return {IMPORTS_FILE_ENV: self.imports.path}

    @property
    def available(self) -> bool:
        """Whether the next worker would be forked (a template is ready and not busy)."""
        return self._process is not None and self._process.ready and not self._importing

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            if self._preloading:
                self._start()
            if self._learning:
                self._tg.start_soon(self._learn_wanted)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tg is not None
        if self._process is not None and self._importing:
            self._process.kill()  # busy importing, it would not see the socket close for long
        self._process = None
        self._tg.cancel_scope.cancel()  # each reader closes its socket: its template exits
        await self._tg.__aexit__(exc_type, exc, tb)

    def _start(self) -> None:
        """Exec a template (non-blocking: its imports run on their own)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cwd = os.getcwd()
        config = {
            "fd": theirs.fileno(),
            "path0": script_path0(self.command.kind, self.command.target, cwd),
            "modules": list(self.modules),
        }
        interpreter = shutil.which(self.command.interpreter, path=self._env.get("PATH", os.defpath))
        try:
            if interpreter is None:
                raise FileNotFoundError(2, "not found or not executable", self.command.interpreter)
            popen = subprocess.Popen(
                [*self._prefix, interpreter, *self.command.options, PROGRAM, json.dumps(config)],
                env=self._env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._process = _Process(popen, ours)
        self._starts += 1
        self._wake_learner.set()
        assert self._tg is not None
        self._tg.start_soon(self._read, self._process)

    async def wait_ready(self) -> None:
        """Wait until the template has imported its modules; raise :class:`PreloadError` if
        they cannot be preloaded (the launch fails: the job never runs without them). A
        template that only learns has nothing to wait for."""
        if not self._preloading:
            return
        while self._first_answer is None:
            await self._wait_arrival()
        answer = self._first_answer
        if isinstance(answer, codec.Refused):
            raise PreloadError(self.modules, answer.reason)

    # -- requests ------------------------------------------------------------------------------

    def fork(
        self,
        command: PythonCommand,
        env: Mapping[str, str],
        *,
        stdin: Redirect,
        stdout: Redirect,
        stderr: Redirect,
        pass_fds: Sequence[int] = (),
    ) -> int | None:
        """Fork a worker running ``command`` with ``env``; its pid, or None when it must be
        started plainly (no template ready, the template busy, or it refused: logged)."""
        process = self._usable_process()
        if process is None or command.options != self.command.options:
            self.plain_starts += 1
            return None
        request_id = self._take_id()
        fds, opened = _descriptors((stdin, stdout, stderr))
        try:
            request = codec.Fork(
                request_id,
                command.kind,
                command.target,
                command.args,
                without_worker_site(env),
                os.getcwd(),
                (0, 1, 2, *pass_fds),
                self.seed,
            )
            data = codec.encode(request)
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fd_bytes([*fds, *pass_fds]))]
            try:
                process.control.sendmsg([data], ancillary)
            except OSError as exc:
                self._lost(process, f"could not send it a fork request: {exc}")
                self.plain_starts += 1
                return None
        finally:
            for fd in opened:
                os.close(fd)
        reply = self._wait_sync(process, request_id)
        if isinstance(reply, codec.Forked):
            self.forks += 1
            return reply.pid
        if isinstance(reply, codec.Refused):
            logger.warning("the fork template refused a worker (started plainly): %s", reply.reason)
            if reply.fatal:
                self._lost(process, reply.reason)
        self.plain_starts += 1
        return None

    async def reap(self, pid: int) -> int:
        """Reap forked worker ``pid`` (exited, its group killed); its exit status.

        If the template died meanwhile the status is lost: the worker died with it (SIGKILL).
        """
        process = self._process
        if process is None or not process.ready:
            return -signal.SIGKILL
        request_id = self._take_id()
        try:
            process.control.send(codec.encode(codec.Reap(request_id, pid)))
        except OSError:
            return -signal.SIGKILL
        reply = await self._wait_async(process, request_id)
        if isinstance(reply, codec.Reaped):
            return reply.returncode
        logger.warning("exit status of worker %d unknown (%s): taken as SIGKILL", pid, reply)
        return -signal.SIGKILL

    async def import_modules(self, modules: Sequence[str]) -> None:
        """Import ``modules`` in the template too, so the next forks have them (the learned
        modules of a warm worker, say). Raise :class:`PreloadError` if one fails to import or
        leaves the template unsafe to fork (a new template with the original modules then
        replaces it). Workers started meanwhile start plainly."""
        names = check_module_names(modules)
        process = self._process
        if process is None or not process.ready or self._importing:
            raise PreloadError(names, "no template is ready to import them (try again later)")
        request_id = self._take_id()
        self._importing = True
        try:
            process.control.send(codec.encode(codec.Import(request_id, names)))
            reply = await self._wait_async(process, request_id)
        except OSError as exc:
            raise PreloadError(names, f"the template is gone: {exc}") from None
        finally:
            self._importing = False
        if isinstance(reply, codec.Refused):
            if reply.fatal:
                self._lost(process, reply.reason)
            raise PreloadError(names, reply.reason)
        if not isinstance(reply, codec.Imported):
            raise PreloadError(names, "the template is gone")
        self.modules = (*self.modules, *(n for n in names if n not in self.modules))

    def learn(self, names: Sequence[str]) -> None:
        """Have the template import ``names`` too (what running workers had loaded), in the
        background and leniently; a template that only learns starts with the first names
        worth it (:func:`~aioelastic.agent._learned.worth_a_template`)."""
        new = [
            name
            for name in names
            if name not in self._wanted and all(part.isidentifier() for part in name.split("."))
        ]
        if self._learning and new:
            self._wanted.update(dict.fromkeys(new))
            self._wake_learner.set()

    async def _learn_wanted(self) -> None:
        """Bring each template (this one, a replacement) up to what :meth:`learn` was told,
        one lenient import at a time."""
        while True:
            process = self._process
            missing = [name for name in self._wanted if name not in self._rejected]
            if process is not None:
                missing = [name for name in missing if name not in process.learned]
            if not missing:
                await self._wake_learner.wait()
                self._wake_learner = anyio.Event()
            elif process is None:
                if self._starts > 0 or not worth_a_template(missing):
                    await self._wake_learner.wait()  # gone for good, or not worth one yet
                    self._wake_learner = anyio.Event()
                else:
                    self._start()
            elif not process.ready or self._importing:
                await self._wait_arrival()
            else:
                await self._import_learned(process, _first_bytes(missing, LEARN_BYTES))

    async def _import_learned(self, process: _Process, names: list[str]) -> None:
        request_id = self._take_id()
        self._importing = True
        started = time.monotonic()
        try:
            process.control.send(codec.encode(codec.Import(request_id, tuple(names), True)))
            reply = await self._wait_async(process, request_id)
        except OSError as exc:
            self._lost(process, f"could not send it modules to import: {exc}")
            return
        finally:
            self._importing = False
        process.learned.update(names)
        if isinstance(reply, codec.Imported):
            self._rejected.update(reply.left_out)
            self.learned = tuple(dict.fromkeys([*self.learned, *reply.modules]))
            took = time.monotonic() - started
            self._emit(TemplateLearned(process.popen.pid, reply.modules, reply.left_out, took))
        elif isinstance(reply, codec.Refused):  # fatal: it forks no more; a new one skips them
            self._rejected.update(names)
            if reply.fatal:
                self._lost(process, f"importing what the workers loaded: {reply.reason}")

    # -- the socket --------------------------------------------------------------------------

    def _take_id(self) -> int:
        self._next_id += 1
        self._waiting.add(self._next_id)
        return self._next_id

    def _usable_process(self) -> _Process | None:
        process = self._process
        if process is None or self._importing:
            return None
        if process.popen.poll() is not None:
            self._lost(process, _died(process))
            return self._process if self._process and self._process.ready else None
        return process if process.ready else None

    def _deliver(self, process: _Process, reply: codec.Reply) -> None:
        if reply.id == 0:
            self._answered(process, reply)
        elif reply.id in self._waiting:
            self._replies[reply.id] = reply
        else:
            logger.warning("ignored an answer of the fork template to no request: %s", reply)
        self._arrived.set()
        self._arrived = anyio.Event()

    def _answered(self, process: _Process, reply: codec.Reply) -> None:
        """The template's first message: ready, or it cannot preload."""
        first = self._first_answer is None
        if first:
            self._first_answer = reply
        if isinstance(reply, codec.Ready):
            process.ready = True
            took = time.monotonic() - process.started
            self._emit(TemplateReady(reply.pid, self.modules, took))
        elif not first:  # a replacement that cannot preload: plain starts from now on
            assert isinstance(reply, codec.Refused)
            self._lost(process, f"a new template could not preload: {reply.reason}", final=True)

    def _receive_ready(self, process: _Process) -> bool:
        """Take every packet waiting on ``process``'s socket; False once it is closed."""
        while True:
            try:
                data = process.control.recv(codec.MAX_MESSAGE)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            try:
                reply = codec.decode(data)
            except codec.TemplateCodecError as exc:
                logger.warning("ignored a malformed message from the fork template: %s", exc)
                continue
            if not isinstance(reply, codec.Fork | codec.Reap | codec.Import):
                self._deliver(process, reply)

    async def _read(self, process: _Process) -> None:
        """Read ``process``'s answers until its socket closes or the agent gives it up; then
        close the socket (only now: its descriptor number stays taken while it is watched) and
        reap the template, killing it if it does not leave."""
        try:
            with process.reading, suppress(OSError):
                while True:
                    await anyio.wait_readable(process.control)
                    if not self._receive_ready(process):
                        break
            if self._process is process:  # it closed its end: it is dying
                await _exited(process)
                self._lost(process, _died(process))
        finally:
            process.control.close()  # end of file: a template still running exits
            with anyio.CancelScope(shield=True):
                await _exited(process)
                process.kill()
                process.popen.wait()

    async def _wait_arrival(self) -> None:
        await self._arrived.wait()

    async def _wait_async(self, process: _Process, request_id: int) -> codec.Reply | None:
        while request_id not in self._replies:
            if self._process is not process:
                self._waiting.discard(request_id)
                return None
            await self._wait_arrival()
        self._waiting.discard(request_id)
        return self._replies.pop(request_id)

    def _wait_sync(self, process: _Process, request_id: int) -> codec.Reply | None:
        """Block until the answer to ``request_id`` (others' answers are kept for them)."""
        deadline = time.monotonic() + REPLY_TIMEOUT
        while request_id not in self._replies:
            left = deadline - time.monotonic()
            if self._process is not process:
                self._waiting.discard(request_id)
                return None
            if left <= 0:
                self._lost(process, f"it did not answer a fork within {REPLY_TIMEOUT:g} s")
                return None
            readable, _, _ = select.select([process.control], [], [], left)
            if readable and not self._receive_ready(process):
                _exited_sync(process)
                self._lost(process, _died(process))
                return None
        self._waiting.discard(request_id)
        return self._replies.pop(request_id)

    def _lost(self, process: _Process, reason: str, *, final: bool = False) -> None:
        """``process`` can serve no more: replace it while restarts remain, else go plain."""
        if self._process is not process:
            return
        process.kill()
        process.reading.cancel()
        self._process = None
        if self._first_answer is None:  # the first template died while importing
            self._first_answer = codec.Refused(0, f"the template {reason}", fatal=True)
        if self._starts == 1 and isinstance(self._first_answer, codec.Refused):
            self._arrived.set()
            self._arrived = anyio.Event()
            return  # the launch fails on it (wait_ready): no event
        restarting = not final and self._restarts_left > 0 and self._first_answer is not None
        restarting = restarting and isinstance(self._first_answer, codec.Ready)
        self._emit(TemplateLost(process.popen.pid, reason, restarting))
        self._arrived.set()
        self._arrived = anyio.Event()
        if restarting:
            self._restarts_left -= 1
            try:
                self._start()
            except OSError as exc:
                self._emit(TemplateLost(None, f"a new template could not start: {exc}", False))


@asynccontextmanager
async def node_template(
    spec: WorkerSpec,
    directory: str,
    *,
    emit: Callable[[AgentEvent], None],
    guardian: Guardian | None,
    prefix: Sequence[str],
) -> AsyncIterator[Template | None]:
    """The node's fork template for ``spec``'s workers (started through ``prefix``): with
    ``spec.preload`` started now, so that its imports run while the agent rendezvouses;
    learning (``spec.fork_template``), started once the workers loaded something worth it
    (what they import is recorded in ``directory``, the agent's private one). None when
    workers cannot be forked."""
    learn = spec.fork_template == "auto" and spec.numa_binding is None
    try:
        command = python_command(spec.argv) if spec.preload or learn else None
    except ValueError as exc:  # not a Python script: the spec checked --preload's case
        logger.debug("workers start plainly (no fork template): %s", exc)
        command = None
    if command is None:
        yield None
        return
    template = Template(
        command,
        spec.preload,
        learn=learn,
        env=template_env(os.environ, spec.env, spec.local_world_size),
        emit=emit,
        guardian=guardian,
        prefix=prefix,
        imports_file=str(Path(directory, "imports")),
    )
    async with template:
        yield template


async def _exited(process: _Process) -> None:
    """Wait (at most :data:`EXIT_TIMEOUT`) for ``process`` to exit."""
    with suppress(OSError), anyio.move_on_after(EXIT_TIMEOUT):
        pidfd = os.pidfd_open(process.popen.pid)
        try:
            await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
    process.popen.poll()


def _exited_sync(process: _Process) -> None:
    """Block (at most :data:`DYING_BOUND`) until ``process``, whose socket just closed, has
    exited: a dying process's descriptors close before its exit status can be read, so
    without this a template killed by a signal would be reported as one that closed its
    socket."""
    with suppress(OSError):
        pidfd = os.pidfd_open(process.popen.pid)
        try:
            select.select([pidfd], [], [], DYING_BOUND)
        finally:
            os.close(pidfd)
    process.popen.poll()


def _died(process: _Process) -> str:
    """How ``process`` ended, as far as known without waiting."""
    code = process.popen.poll()
    if code is None:
        return "it closed its socket"
    if code < 0:
        return (
            f"it died ({signal.Signals(-code).name})"
            if -code in signal.valid_signals()
            else "it died"
        )
    return f"it died (exit status {code})"


def _first_bytes(names: Sequence[str], limit: int) -> list[str]:
    """The first of ``names`` (one at least) whose lengths add up to at most ``limit``."""
    taken: list[str] = []
    size = 0
    for name in names:
        size += len(name) + 4  # its quotes, comma and space in the JSON request
        if taken and size > limit:
            break
        taken.append(name)
    return taken


def _descriptors(redirects: Sequence[Redirect]) -> tuple[list[int], list[int]]:
    """The descriptor each of stdin, stdout, stderr gets, and those opened here to close."""
    fds, opened = [], []
    for number, redirect in enumerate(redirects):
        if redirect is None:
            fds.append(number)
        elif redirect == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            opened.append(fd)
            fds.append(fd)
        elif isinstance(redirect, int):
            fds.append(redirect)
        else:
            fds.append(redirect.fileno())
    return fds, opened


def _fd_bytes(fds: Sequence[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()
