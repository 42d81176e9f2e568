"""The fork template program (``aioelastic run --preload``): import once, then only fork.

Run by :class:`~aioelastic.agent._template.Template` as ``python [the workers' interpreter
options] _template_main.py CONFIG`` (exec'd, never forked from the threaded agent), with the
agent's control socket (``SOCK_SEQPACKET``, see ``_template_codec.py``) as descriptor
``CONFIG["fd"]``. It sets ``sys.path[0]`` to what the workers' would be, imports the modules
to preload, checks that a fork is safe, answers :class:`Ready`, then serves requests one at a
time: fork a worker, reap one, import more modules (named ones strictly; learned ones, what
running workers had loaded, leniently: :func:`learn_all`).

What keeps a fork safe (each checked before every fork; a failed check refuses, naming the
cause): the template runs no tensor op and never initialises CUDA (``torch.cuda`` must not be
initialised: a forked child cannot use it); it holds no socket but its control socket; it is
single-threaded (OpenBLAS's idle worker threads, started by importing numpy or torch, are
stopped first, as OpenBLAS's own fork handler would). ``gc.freeze()`` before each fork keeps
the imported objects' pages shared. A check that fails after the modules were imported is
fatal: the template answers :class:`Refused` with ``fatal`` set and exits.

The child (:func:`_become_worker`) leads its own session, dies with the template
(``PR_SET_PDEATHSIG``, the template itself dies with the agent), gets its stdin, stdout,
stderr and passed descriptors where the request says, its directory, its environment, the
signal dispositions the template started with, reseeds ``random``, NumPy and torch from (seed,
rank, restart count), reopens logging's files, then runs the entrypoint as ``python script``
(or ``-m module``) would, through :mod:`runpy`. It ends as such a process ends: non-daemon
threads joined, atexit handlers run once (the ones preloaded modules registered in the
template included: a plain worker would have registered them too), the streams flushed, then
``os._exit`` with the exit status (an uncaught ``KeyboardInterrupt`` ends it by SIGINT). The
template tells the agent the pid only once the child has set all that up, so the worker's
process group exists when the agent first signals it.

This module imports only the standard library (the codec and the checks by their paths), so
the template's children carry nothing of the agent.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import logging
import os
import random
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aioelastic.agent import _template_checks as checks
    from aioelastic.agent import _template_codec as codec
else:

    def _load_sibling(stem: str) -> ModuleType:
        """This package's module ``stem``, loaded by its path (not through ``aioelastic``)."""
        name = f"_aioelastic{stem}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    codec = _load_sibling("_template_codec")
    checks = _load_sibling("_template_checks")

PR_SET_PDEATHSIG = 1
SEED_VARIABLE = "AIOELASTIC_SEED"
"""A worker environment variable fixing the seed the children's streams derive from."""


# -- the child ---------------------------------------------------------------------------------


def _set_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _place_descriptors(
    received: Sequence[int], targets: Sequence[int], keep_away: Sequence[int]
) -> None:
    """Put ``received[i]`` at ``targets[i]``; close every other descriptor of ours."""
    floor = max([*targets, *received, *keep_away, 2]) + 1
    moved = [_dup_above(fd, floor) for fd in received]
    for fd in {*received, *keep_away}:
        os.close(fd)
    for source, target in zip(moved, targets, strict=True):
        os.dup2(source, target, inheritable=True)
    for source in moved:
        os.close(source)


def _dup_above(fd: int, floor: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


class _SeedWatch(importlib.abc.MetaPathFinder):
    """Notes whether ``random.seed`` or ``torch.manual_seed`` is called while the modules are
    imported (for torch: through a finder that wraps ``manual_seed`` once torch is loaded)."""

    def __init__(self) -> None:
        self.random_called = False
        self.torch_called = False
        self._random_seed = random.seed
        self._torch: tuple[ModuleType, Any] | None = None

    def __enter__(self) -> _SeedWatch:
        original = self._random_seed

        def seed(*args: Any, **kwargs: Any) -> None:
            self.random_called = True
            original(*args, **kwargs)

        random.seed = seed
        if "torch" not in sys.modules:
            sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc: object) -> None:
        random.seed = self._random_seed
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if self._torch is not None:
            module, original = self._torch
            setattr(module, "manual_seed", original)  # noqa: B010

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = None if spec is None else spec.loader
        if loader is None:
            return spec
        exec_module = loader.exec_module

        def exec_and_watch(module: ModuleType) -> None:
            exec_module(module)
            original = getattr(module, "manual_seed")  # noqa: B009

            def manual_seed(seed: int) -> Any:
                self.torch_called = True
                return original(seed)

            setattr(module, "manual_seed", manual_seed)  # noqa: B010
            self._torch = (module, original)

        loader.exec_module = exec_and_watch  # type: ignore[method-assign]
        return spec


def _reseed(
    seed: int, env: Mapping[str, str], keep: Collection[str], random_state: Any = None
) -> None:
    rank = env.get("RANK", "")
    if not rank or rank.startswith("-"):  # a spare holds no rank yet: its own stream
        rank = f"pid{os.getpid()}"
    job_seed = int(env[SEED_VARIABLE]) if env.get(SEED_VARIABLE, "").isdigit() else seed
    value = checks.derive_seed(job_seed, rank, env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if "random" not in keep:
        random.seed(value)
    elif random_state is not None:  # CPython reseeds random in every child: undo that
        random.setstate(random_state)
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        numpy.random.seed(value % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed") and "torch" not in keep:
        torch.manual_seed(value)


def _reopen_logging() -> None:
    """Give each logging file handler its own open file (not the template's descriptor)."""
    for ref in list(getattr(logging, "_handlerList", [])):
        handler = ref()
        if isinstance(handler, logging.FileHandler) and handler.stream is not None:
            handler.stream = handler._open()  # the template's stream stays the template's


def _reconfigure_stdio() -> None:
    """The console rules of a fresh interpreter for the new descriptors 0, 1, 2."""
    stdout = sys.stdout
    if isinstance(stdout, io.TextIOWrapper) and not stdout.write_through:
        stdout.reconfigure(line_buffering=os.isatty(1))


def _become_worker(
    request: codec.Fork,
    received: Sequence[int],
    control: int,
    report: int,
    signals: Mapping[int, Any],
    template: int,
    keep_seeds: Collection[str] = frozenset(),
    random_state: Any = None,
) -> None:
    """Set the child up as the request says and run it. What the agent relies on (its own
    session, dying with ``template``, its descriptors, directory, environment, signals) is
    done before ``report`` closes, so the template answers once it holds; a failure there is
    written to ``report`` (exit 127). The rest runs after, as the interpreter's start would."""
    try:
        os.setsid()
        _set_pdeathsig()
        if os.getppid() != template:  # it died before the prctl: nobody would supervise us
            os._exit(1)
        high = _dup_above(report, max([*request.fds, *received, control, 2]) + 1)
        os.close(report)
        report = high
        _place_descriptors(received, request.fds, (control,))
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        for signum, handler in signals.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
    except BaseException as exc:
        os.write(report, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(127)
    os.close(report)
    try:
        interpreter = sys.orig_argv[: max(len(sys.orig_argv) - 2, 1)]  # less program, config
        entry = ["-m", request.target] if request.kind == "module" else [request.target]
        sys.orig_argv = [*interpreter, *entry, *request.args]
        sys.argv = [request.target, *request.args]
        sys.path[0] = checks.script_path0(request.kind, request.target, request.cwd)
        _reseed(request.seed, request.env, keep_seeds, random_state)
        _reopen_logging()
        _reconfigure_stdio()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(run_entrypoint(request.kind, request.target))


def _exit_code(exc: SystemExit) -> int:
    """The status ``python`` exits with for an uncaught ``SystemExit`` (printing a message)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def run_entrypoint(kind: str, target: str) -> int:
    """Run ``target`` as ``__main__`` and end as the interpreter would; return the status."""
    code, interrupted = 0, False
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt as exc:
        exc.__traceback__ = _user_frames(exc.__traceback__)
        traceback.print_exception(exc)
        code, interrupted = 130, True
    except BaseException as exc:
        exc.__traceback__ = _user_frames(exc.__traceback__)  # the hook prints the exception's
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    code = _finalize(code)
    if interrupted:  # as CPython does: die of SIGINT so the parent sees it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its first frames in this module and :mod:`runpy` (``python script``'s
    traceback starts in the script)."""
    ours = os.path.abspath(__file__)
    while tb is not None and (
        tb.tb_frame.f_globals.get("__name__") == "runpy"
        or os.path.abspath(tb.tb_frame.f_code.co_filename) == ours
    ):
        tb = tb.tb_next
    return tb


def _finalize(code: int) -> int:
    """What interpreter shutdown does before the process ends: join non-daemon threads,
    run the atexit handlers once, flush the standard streams."""
    shutdown = getattr(threading, "_shutdown", None)
    try:
        if shutdown is not None:
            shutdown()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
    atexit._run_exitfuncs()  # prints, never raises, what a handler raised
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            code = code or 120  # as CPython when flushing stdout fails at exit
    return code


# -- the template's loop ---------------------------------------------------------------------


class TemplateServer:
    """Serve the agent's requests on ``control`` until it closes the socket."""

    def __init__(self, control: socket.socket, signals: Mapping[int, Any]) -> None:
        self.control = control
        self.signals = signals
        self.stoppers: list[Any] = []
        self.keep_seeds: frozenset[str] = frozenset()
        """The generators a preloaded module seeded (children keep their seed)."""

    def settle(self) -> str | None:
        """After imports: collect, freeze what is left (its pages stay shared), find the idle
        pools to stop at each fork; why forking is unsafe now, or None."""
        gc.collect()
        gc.freeze()
        self.stoppers = checks.idle_pool_stoppers()
        return self.check()

    def send(self, message: codec.Message) -> None:
        self.control.send(codec.encode(message))

    def check(self, received: Sequence[int] = ()) -> str | None:
        """Why forking is unsafe now (None: it is safe); ``received``: a request's own
        descriptors (sockets the agent passes to the worker are the worker's)."""
        gc.freeze()  # what the agent's requests created since: cheap, keeps it shared too
        return checks.fork_refusal((self.control.fileno(), *received), self.stoppers)

    def serve(self) -> None:
        while True:
            try:
                data, fds = _receive(self.control)
            except ConnectionError:
                return
            if not data and not fds:
                return
            try:
                request = codec.decode(data)
            except codec.TemplateCodecError as exc:
                _close_all(fds)
                self.send(codec.Refused(-1, f"malformed request: {exc}"))
                continue
            if isinstance(request, codec.Fork):
                self.send(self.fork(request, fds))  # a child's setup failure never gets here
            else:
                _close_all(fds)
                if isinstance(request, codec.Reap):
                    self.send(self.reap(request))
                elif isinstance(request, codec.Import):
                    reply = self.import_modules(request)
                    self.send(reply)
                    if isinstance(reply, codec.Refused) and reply.fatal:
                        return
                else:
                    self.send(codec.Refused(-1, f"not a request: {type(request).__name__}"))

    def fork(self, request: codec.Fork, received: list[int]) -> codec.Reply:
        try:
            if len(received) != len(request.fds):
                return codec.Refused(
                    request.id, f"{len(received)} descriptors came for {len(request.fds)} targets"
                )
            own = {self.control.fileno(), *received}
            reason = checks.fd_collision(request.fds, checks.open_descriptors(), own)
            if reason is not None:
                return codec.Refused(request.id, reason)
            reason = self.check(received)
            if reason is not None:
                return codec.Refused(request.id, reason)
            reader, writer = os.pipe()
            template = os.getpid()
            random_state = random.getstate()
            try:
                pid = os.fork()
            except OSError:
                _close_all((reader, writer))
                raise
            if pid == 0:
                os.close(reader)
                _become_worker(
                    request,
                    received,
                    self.control.fileno(),
                    writer,
                    self.signals,
                    template,
                    self.keep_seeds,
                    random_state,
                )
            os.close(writer)
            failure = _read_all(reader)
            if failure:
                os.waitpid(pid, 0)
                return codec.Refused(
                    request.id,
                    f"the worker could not be set up: {failure.decode(errors='replace')}",
                )
            return codec.Forked(request.id, pid)
        except OSError as exc:
            return codec.Refused(request.id, f"fork failed: {exc}")
        finally:
            _close_all(received)

    def reap(self, request: codec.Reap) -> codec.Reply:
        try:
            _, status = os.waitpid(request.pid, 0)
        except ChildProcessError:
            return codec.Refused(request.id, f"pid {request.pid} is not a child of the template")
        return codec.Reaped(request.id, request.pid, os.waitstatus_to_exitcode(status))

    def import_modules(self, request: codec.Import) -> codec.Reply:
        held: list[str] = []
        left_out: list[str] = []
        with _SeedWatch() as watch:
            if request.learned:
                left_out = learn_all(request.modules)
                held = [name for name in request.modules if name in sys.modules]
                failure = None
            else:
                failure = import_all(request.modules)
        self.keep_seeds |= checks.user_seeded(watch.random_called, watch.torch_called)
        if failure is not None:
            return codec.Refused(request.id, failure)
        reason = self.settle()
        if reason is not None:
            return codec.Refused(request.id, reason, fatal=True)
        return codec.Imported(request.id, tuple(held), tuple(left_out))


def import_all(modules: Sequence[str]) -> str | None:
    """Import ``modules``; what went wrong (with the traceback's last line) or None."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # SystemExit from a module counts too
            lines = traceback.format_exception_only(type(exc), exc)
            return (
                f"preloading {name!r} failed: {''.join(lines).strip()}; fix the module or "
                f"drop it from --preload (python -c 'import {name}' shows the same error)"
            )
    return None


PROBE_TIMEOUT = 300.0
"""Seconds the throwaway fork of :func:`threaded_imports` may take (torch and its kin)."""


def learn_all(names: Sequence[str]) -> list[str]:
    """Import what of ``names`` (modules running workers had loaded) a template may hold:
    a name whose import starts a thread in a throwaway fork (:func:`threaded_imports`) is
    left out, with every name under it; a failing import is skipped (the worker's own import
    will say why). The names left out, in order."""
    pending = [name for name in dict.fromkeys(names) if name not in sys.modules]
    threaded = threaded_imports(pending)
    for name in pending:
        if name not in sys.modules and not _under(name, threaded):
            with contextlib.suppress(Exception, SystemExit):
                importlib.import_module(name)
    return [name for name in pending if _under(name, threaded)]


def _under(name: str, modules: Collection[str]) -> bool:
    """Whether ``name`` is one of ``modules`` or a submodule of one (it imports its parent)."""
    parts = name.split(".")
    return any(".".join(parts[:n]) in modules for n in range(1, len(parts) + 1))


def threaded_imports(names: Sequence[str], timeout: float = PROBE_TIMEOUT) -> set[str]:
    """The modules among ``names`` whose import starts a thread (with every module that import
    loaded), found by importing them in order in a throwaway fork of this (single-threaded)
    process, which stays as it is. If the probe fails, every name counts as threaded: nothing
    unproven is imported."""
    if not names:
        return set()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: import, count this process's threads, answer, vanish
        os.close(read)
        _set_pdeathsig()
        found: list[str] = []
        for name in names:
            before, loaded = _threads(), len(sys.modules)
            try:
                importlib.import_module(name)
            except BaseException:
                continue
            if _threads() > before:  # an idle pool the template stops at each fork is fine
                for stop in checks.idle_pool_stoppers():
                    stop()
            if _threads() > before:  # any module this import loaded may have started it
                found += [name, *list(sys.modules)[loaded:]]
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    try:
        answer = _read_within(read, timeout)
        return set(json.loads(answer)) if answer else set(names)
    except ValueError:
        return set(names)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _read_within(fd: int, timeout: float) -> bytes:
    """What ``fd`` holds until its end, or b"" if that takes over ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    try:
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
        return b""
    finally:
        os.close(fd)


def _receive(control: socket.socket) -> tuple[bytes, list[int]]:
    fds: list[int] = []
    data, ancillary, flags, _ = control.recvmsg(
        codec.MAX_MESSAGE, socket.CMSG_SPACE(codec.MAX_FDS * 4)
    )
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(memoryview(payload)[:usable].cast("i"))
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        _close_all(fds)
        return b"{}", []  # decodes to an error answered as a malformed request
    return data, fds


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            continue


def main(argv: Sequence[str]) -> int:
    """Import the modules of ``argv[1]`` (JSON: fd, path0, modules), answer, then serve."""
    config = json.loads(argv[1])
    sys.path[0] = config["path0"]
    signals: dict[int, Any] = {
        signum: handler
        for signum in signal.valid_signals()
        if signum not in (signal.SIGKILL, signal.SIGSTOP)
        and (handler := signal.getsignal(signum)) is not None
    }
    control = socket.socket(fileno=config["fd"])
    server = TemplateServer(control, signals)
    with _SeedWatch() as watch:
        failure = import_all(config["modules"])
    server.keep_seeds = checks.user_seeded(watch.random_called, watch.torch_called)
    if failure is None:
        failure = server.settle()
    try:
        if failure is not None:
            server.send(codec.Refused(0, failure, fatal=True))
            return 1
        server.send(codec.Ready(0, os.getpid(), len(sys.modules)))
        server.serve()
    except ConnectionError:  # the agent is gone (it gave this template up, or exited)
        return 0
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv))  # not the preloaded modules' atexit handlers: they are the workers'
