"""The FIFO watchdog's server, ``FileTimerServer``, wire-compatible with PyTorch's.

The server reads the FIFO through a descriptor opened read-write and non-blocking, so it never
sees end-of-file when writers come and go, and waits with ``anyio.wait_readable`` (no thread,
no polling). Each process that acquires a timer is admitted once: safety rules and the watch
policy are checked and a pidfd is opened; the pidfd becoming readable means the process
exited and its timers are dropped; signals go through the pidfd, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal as _signal
import stat
import tempfile
import termios
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from aioelastic._clock import Clock
from aioelastic.timer._codec import LineDecoder, Rejection
from aioelastic.timer._errors import TimerConfigError
from aioelastic.timer._events import (
    ProcessExited,
    RejectReason,
    TimerExpired,
    TimerReaped,
)
from aioelastic.timer._heap import Timer
from aioelastic.timer._policy import WatchPolicy, forbidden_reason
from aioelastic.timer._server import (
    EventCallback,
    LogEvent,
    ProcessGone,
    TimerServerBase,
    as_request,
    logger,
)

_READ_SIZE = 1 << 20
"""One read takes up to a full default-sized pipe."""
_SLICE = 1 << 16
"""Bytes decoded and applied between two drains of the pipe."""
_BACKLOG_LIMIT = 64 << 20
"""Bytes read ahead of processing at most; beyond, the pipe holds the rest (backpressure)."""
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

BeforeReap = Callable[[TimerExpired], Awaitable[None]]


def _pipe_max_size() -> int:
    """The largest pipe buffer an unprivileged process may ask for (Linux), else 1 MiB."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return 1 << 20


def _drain(fd: int, backlog: bytearray) -> None:
    """Read what the pipe holds into ``backlog`` (until it is empty or the backlog is full)."""
    while len(backlog) < _BACKLOG_LIMIT:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        backlog += data
        if not data:
            return


@dataclass(eq=False, slots=True)
class _Process:
    """A watched process: its pidfd and whether it has exited."""

    pid: int
    pidfd: int
    exited: anyio.Event = field(default_factory=anyio.Event)


def _check_directory(directory: str) -> None:
    """Refuse a FIFO directory where other users could swap the FIFO (writable, not sticky)."""
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return  # mkfifo reports a missing directory with a clearer message
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise TimerConfigError(
            f"the FIFO directory {directory!r} is writable by other users (mode "
            f"{stat.S_IMODE(mode):o}) without the sticky bit, so they could replace the FIFO; "
            "use a private directory (or file_path=None)"
        )


class FileTimerServer(TimerServerBase):
    """Serves timer requests written to a FIFO by any process on this host.

    ``async with server:`` creates the FIFO (mode 0600) and serves until the block exits, then
    removes it; ``await task_group.start(server.serve)`` serves inside the caller's task group.
    With ``file_path=None`` the FIFO is created in a new private directory (``file_path`` tells
    where once serving). ``max_interval`` and ``daemon`` are accepted for PyTorch signature
    compatibility and unused: expiry happens at each deadline.

    Reaping sends the request's signal (``<= 0``: report only). With ``kill_grace`` set,
    SIGTERM goes first and the request's signal follows if the process outlives the grace
    period; ``before_reap`` (for example a stack dump) runs first, bounded by ``hook_timeout``.
    ``watch`` restricts which processes may hold timers (default: the server's own user).
    ``pipe_size`` is asked of the kernel for the FIFO (up to ``/proc/sys/fs/pipe-max-size``);
    ``coalesce`` is how long requests may gather after the FIFO turns readable before they are
    read in one go (seconds; 0: at once): each wake-up costs this host's kernel and loop far
    more than decoding a request, so a burst is read in one. An armed deadline is never late
    for it, since expiry reads the FIFO first, and a release written before its deadline is
    honoured. Requests are judged as of when they were written: a process's exit is handled
    after what it wrote before exiting, and an acquire from a process gone by the time it is
    read stands if its release follows in the same read (else it is rejected: nothing is left
    to watch), so the window loses nothing. A longer one costs less CPU under steady traffic
    (torch's server reads every 0.1 s), but a timer shorter than it may fire up to that much
    late.
    """

    def __init__(
        self,
        file_path: str | os.PathLike[str] | None,
        run_id: str = "",
        max_interval: float | None = None,
        daemon: bool = True,
        log_event: LogEvent | None = None,
        *,
        on_event: EventCallback | None = None,
        watch: WatchPolicy | None = None,
        kill_grace: float | None = None,
        before_reap: BeforeReap | None = None,
        hook_timeout: float = 5.0,
        pipe_size: int = 1 << 20,
        coalesce: float = 0.01,
        clock: Clock | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            run_id, log_event=log_event, on_event=on_event, clock=clock, wall_clock=wall_clock
        )
        checked = (
            ("kill_grace", kill_grace),
            ("hook_timeout", hook_timeout),
            ("coalesce", coalesce),
        )
        for name, seconds in checked:
            if seconds is not None and not seconds >= 0:
                raise TimerConfigError(f"{name} must be >= 0 seconds, got {seconds!r}")
        self._requested_path = None if file_path is None else os.fspath(file_path)
        self._path: str | None = None
        self._private_dir: str | None = None
        self._watch = watch if watch is not None else WatchPolicy.same_user()
        self._kill_grace = kill_grace
        self._before_reap = before_reap
        self._hook_timeout = hook_timeout
        self._pipe_size = pipe_size
        self._coalesce = coalesce
        self._decoder = LineDecoder()
        self._backlog = bytearray()
        self._fd: int | None = None
        self._inode = -1
        self._processes: dict[int, _Process] = {}
        self._own_pid = self._own_pgid = -1

    @property
    def file_path(self) -> str:
        """The FIFO's path (chosen at start when the server was given ``None``)."""
        path = self._path or self._requested_path
        if path is None:
            raise RuntimeError("the FIFO path is chosen when the server starts serving")
        return path

    @property
    def watch(self) -> WatchPolicy:
        """The policy deciding which processes may hold timers."""
        return self._watch

    def get_last_progress_time(self) -> int:
        """Wall time (s) the server last made progress; now if it has nothing waiting.

        Something waits when bytes sit unread in the FIFO or a deadline has passed unhandled.
        """
        now = self._wall_clock()
        if self._fd is None:
            return int(now)
        pending = int.from_bytes(
            fcntl.ioctl(self._fd, termios.FIONREAD, b"\0\0\0\0"), "little", signed=True
        )
        deadline = self._heap.next_deadline()
        overdue = deadline is not None and deadline < self._clock.now()
        return int(self._last_progress if pending or overdue else now)

    # -- FIFO -----------------------------------------------------------------------------

    def _create_fifo(self) -> str:
        if self._requested_path is None:
            self._private_dir = tempfile.mkdtemp(prefix="aioelastic-timer-")
            path = os.path.join(self._private_dir, "timer.fifo")
        else:
            path = self._requested_path
            _check_directory(os.path.dirname(os.path.abspath(path)))
            with contextlib.suppress(FileNotFoundError):
                existing = os.lstat(path)
                if not stat.S_ISFIFO(existing.st_mode):
                    raise TimerConfigError(
                        f"{path!r} exists and is not a FIFO; remove it or pass another file_path"
                    )
                if existing.st_uid != os.geteuid():
                    raise TimerConfigError(
                        f"the FIFO {path!r} is owned by uid {existing.st_uid}, not by this "
                        f"server's uid {os.geteuid()}; remove it or pass another file_path"
                    )
                logger.warning("replacing the existing FIFO %r (left by an earlier server?)", path)
                os.unlink(path)
        try:
            os.mkfifo(path, 0o600)
        except OSError as exc:
            raise TimerConfigError(
                f"cannot create the FIFO {path!r}: {exc.strerror}; pass a file_path in an "
                "existing directory you can write to (or None for a private one)"
            ) from exc
        os.chmod(path, 0o600)
        return path

    def _open_source(self) -> None:
        self._own_pid, self._own_pgid = os.getpid(), os.getpgrp()
        path = self._create_fifo()
        # Read-write: the server is a writer too, so readers never see EOF between clients.
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, min(self._pipe_size, _pipe_max_size()))
        self._path, self._fd, self._inode = path, fd, os.fstat(fd).st_ino
        logger.info("timer server %r reading %r", self.run_id, path)

    async def _serve_requests(self) -> None:
        assert self._fd is not None
        await self._read_forever(self._fd)

    def _before_expiry(self) -> None:
        self._read_pending()

    def _close_source(self) -> None:
        for process in list(self._processes.values()):
            self._close_process(process)
        fd, self._fd = self._fd, None
        if fd is not None:
            anyio.notify_closing(fd)
            os.close(fd)
        path = self._path
        # Only our own FIFO: a newer server may have replaced it at the same path.
        with contextlib.suppress(FileNotFoundError):
            if path is not None and os.lstat(path).st_ino == self._inode:
                os.unlink(path)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    async def _read_forever(self, fd: int) -> None:
        """Wake when the FIFO is readable, let ``coalesce`` seconds of requests gather, then
        drain the pipe into this process and apply what it held (see :meth:`_read_pending`).

        A writer sending one request at a time costs a wake-up (a context switch, an
        ``epoll`` round and two reads: about 150 us of CPU here) per request without the
        pause; with it, one per ``coalesce``. Neither expiry nor a process's exit waits for
        it: both read the FIFO first.
        """
        while True:
            await anyio.wait_readable(fd)
            if self._coalesce:
                await anyio.sleep(self._coalesce)
            self._read_pending()

    def _read_pending(self) -> None:
        """Apply every request the FIFO holds now: read the pipe empty into this process,
        then decode and apply in slices, emptying the pipe again between slices, so a burst
        waits in our buffer (up to ``_BACKLOG_LIMIT`` bytes) instead of filling the pipe."""
        fd, backlog = self._fd, self._backlog
        if fd is None:
            return
        _drain(fd, backlog)
        while backlog:
            piece = bytes(backlog[:_SLICE])
            del backlog[:_SLICE]
            self._apply(self._decoder.feed_fields(piece))
            _drain(fd, backlog)

    # -- processes ------------------------------------------------------------------------

    def _watched_processes(self) -> int:
        return len(self._processes)

    def _admit(self, pid: int) -> Rejection | None:
        if pid in self._processes:
            return None
        reason = forbidden_reason(pid, own_pid=self._own_pid, own_pgid=self._own_pgid)
        if reason is not None:
            return Rejection(RejectReason.FORBIDDEN_PID, reason, pid)
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return ProcessGone(RejectReason.NO_SUCH_PROCESS, f"pid {pid} does not exist", pid)
        except (OSError, OverflowError) as exc:
            # OverflowError: a pid wider than the kernel's pid_t names no process.
            return Rejection(RejectReason.NO_SUCH_PROCESS, f"pid {pid}: {exc}", pid)
        reason = self._watch.check(pid)
        # Checked after the pidfd was opened: if that process is still alive, the answer was
        # about it and not about a process that reused its pid.
        if select.select([pidfd], [], [], 0)[0]:
            os.close(pidfd)
            return ProcessGone(RejectReason.NO_SUCH_PROCESS, f"pid {pid} has exited", pid)
        if reason is not None:
            os.close(pidfd)
            return Rejection(RejectReason.NOT_WATCHED, f"{reason} ({self._watch.description})", pid)
        process = _Process(pid, pidfd)
        self._processes[pid] = process
        self._spawn(self._watch_exit, process)
        return None

    async def _watch_exit(self, process: _Process) -> None:
        try:
            await anyio.wait_readable(process.pidfd)
        except anyio.ClosedResourceError:
            return
        # What it wrote before exiting is in the pipe: its releases come before its exit.
        self._read_pending()
        dropped = self._heap.release_pid(process.pid)
        self._close_process(process)
        logger.debug("pid %d exited; dropped %d timer(s)", process.pid, len(dropped))
        self._emit(ProcessExited(process.pid, tuple(t.scope_id for t in dropped)))

    def _close_process(self, process: _Process) -> None:
        if self._processes.get(process.pid) is process:
            del self._processes[process.pid]
        if not process.exited.is_set():
            process.exited.set()
            anyio.notify_closing(process.pidfd)
            os.close(process.pidfd)

    # -- reaping --------------------------------------------------------------------------

    def _on_expired(self, timer: Timer, expired: TimerExpired) -> None:
        if timer.signal <= 0:
            return
        # Like PyTorch: a reaped process's other timers go with it.
        self._heap.release_pid(timer.pid)
        process = self._processes.get(timer.pid)
        if process is None:
            return
        if self._before_reap is None and self._kill_grace is None:
            # Nothing to wait for: signal in the same loop step that saw the expiry.
            if self._send(process, timer.signal):
                self._reaped_event(timer, timer.signal, escalated=False)
        else:
            self._spawn(self._reap, process, timer, expired)

    async def _reap(self, process: _Process, timer: Timer, expired: TimerExpired) -> None:
        """Reap with a hook and/or a SIGTERM grace period, which take time."""
        if self._before_reap is not None:
            hook = self._before_reap

            async def run_hook() -> None:
                try:
                    await hook(expired)
                except Exception:
                    logger.exception("before_reap hook failed for pid %d", timer.pid)

            if not await self._finishes_by(run_hook, self._clock.now() + self._hook_timeout):
                logger.warning("before_reap hook for pid %d timed out", timer.pid)
        escalated = False
        if self._kill_grace is not None and timer.signal != _signal.SIGTERM:
            if not self._send(process, _signal.SIGTERM):
                return
            deadline = self._clock.now() + self._kill_grace
            if await self._finishes_by(process.exited.wait, deadline):
                self._reaped_event(timer, _signal.SIGTERM, escalated=False)
                return
            escalated = True
        if self._send(process, timer.signal):
            self._reaped_event(timer, timer.signal, escalated=escalated)

    def _send(self, process: _Process, signum: int) -> bool:
        if process.exited.is_set():
            return False
        try:
            _signal.pidfd_send_signal(process.pidfd, signum)
        except ProcessLookupError:
            return False
        except OSError:
            logger.exception("could not send signal %d to pid %d", signum, process.pid)
            return False
        return True

    def _reaped_event(self, timer: Timer, signum: int, *, escalated: bool) -> None:
        self._reaped += 1
        logger.warning(
            "reaped pid %d with signal %d: scope %r expired", timer.pid, signum, timer.scope_id
        )
        self._emit(
            TimerReaped(
                timer.pid, timer.scope_id, signum, timer.deadline, timer.expiration_time, escalated
            )
        )
        self._log("kill worker process", as_request(timer))

    async def _finishes_by(self, wait: Callable[[], Awaitable[None]], deadline: float) -> bool:
        """Run ``wait()`` until it returns or ``deadline`` passes on the server's clock."""
        with self._clock.move_on_at(deadline) as scope:
            await wait()
        return not scope.cancelled_caught
