"""Helpers for agent tests: the scenario worker, a console that can be waited on, pid checks."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import anyio
import anyio.abc

WORKER = str(Path(__file__).parent / "workers" / "scenario.py")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
"""torchrun itself, for side-by-side tests (they skip without torch)."""
BOUND = 60
"""Generous bound (seconds) for anything involving real processes on a loaded 2-core machine."""


class Console:
    """A binary stream standing in for the agent's stdout/stderr; tests wait for text on it."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False
        self._changed = anyio.Event()

    def write(self, data: bytes) -> int:
        self.data += data
        self._notify()
        return len(data)

    def close(self) -> None:
        """The writer is gone: waiting for more text fails instead of hanging."""
        self.closed = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return self.data.decode()

    async def wait_closed(self) -> None:
        """Return once the writer is gone."""
        while not self.closed:
            await self._changed.wait()

    async def wait_for(self, text: str, count: int = 1) -> None:
        """Return once ``text`` appeared ``count`` times."""
        while self.text.count(text) < count:
            if self.closed:
                raise AssertionError(f"{text!r} never came; the stream ended with {self.text!r}")
            await self._changed.wait()


def pids_in(text: str) -> list[int]:
    """Every pid the scenario worker reported (``pids`` lines, after any rank prefix)."""
    found = []
    for line in text.splitlines():
        _, sep, rest = line.partition("pids ")
        if sep:
            found += [int(p) for p in rest.split()]
    return found


async def wait_gone(pid: int) -> None:
    """Return once process ``pid`` (any process) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


async def read_line(fd: int) -> str:
    """Read one line a child writes to the pipe ``fd`` (non-blocking, no threads)."""
    os.set_blocking(fd, False)
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not chunk:
            raise EOFError(f"pipe closed after {data!r}")
        data += chunk
    return data.decode().strip()


def reaped(pid: int) -> bool:
    """Whether child ``pid`` has been waited for already (no zombie of it is left)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def guardian_of(pid: int) -> int:
    """The pid of the guardian started by agent process ``pid`` (a child running its program)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            with contextlib.suppress(FileNotFoundError):  # a worker that just exited
                if b"_guardian_main.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
    raise AssertionError(f"process {pid} has no guardian child")


def python_worker(*args: str) -> tuple[str, tuple[str, ...]]:
    """The (entrypoint, args) pair running the scenario worker with ``args``."""
    return sys.executable, ("-u", WORKER, *args)


class Launched:
    """An ``aioelastic run`` process; its stdout and stderr are read as they come."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.out = Console()
        self.err = Console()

    async def wait(self) -> int:
        return await self.process.wait()

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def __repr__(self) -> str:
        return f"Launched(out={self.out.text!r}, err={self.err.text!r})"


async def _copy(stream: anyio.abc.ByteReceiveStream | None, console: Console) -> None:
    assert stream is not None
    async for chunk in stream:
        console.write(chunk)
    console.close()


@contextlib.asynccontextmanager
async def launched(
    *argv: str,
    command: str = "run",
    cwd: Path | None = None,
    launcher: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Launched]:
    """Run ``aioelastic COMMAND ARGV`` (or ``LAUNCHER ARGV``, torchrun say) for the block, with
    ``env`` added to the environment; kill it at the end if it still runs."""
    program = [sys.executable, "-m", "aioelastic", command] if launcher is None else launcher
    process = await anyio.open_process(
        [*program, *argv], stdin=subprocess.DEVNULL, cwd=cwd, env={**os.environ, **(env or {})}
    )
    run = Launched(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_copy, process.stdout, run.out)
            tg.start_soon(_copy, process.stderr, run.err)
            try:
                yield run
            finally:
                with anyio.CancelScope(shield=True):
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
                # Output in flight is read; a pipe a stray process holds open is not waited.
                tg.cancel_scope.deadline = anyio.current_time() + 5
    finally:  # also when the block was cancelled: the loop closes after the test
        with anyio.CancelScope(shield=True):
            await process.aclose()


def static_argv(port: int, node_rank: int, *rest: str) -> list[str]:
    """``aioelastic run`` flags of one node of a static 2-node job with one worker a node, its
    store at ``127.0.0.1:PORT``, then ``rest`` (more flags, the script)."""
    return [
        "--nnodes=2",
        "--nproc-per-node=1",
        f"--node-rank={node_rank}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        *rest,
    ]


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Terminal:
    """A pseudo-terminal: what a process started on it writes, and a way to type into it."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        os.set_blocking(self.master, False)
        self.screen = Console()

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def read(self) -> None:
        """Copy the terminal's output to :attr:`screen` until every process holding the
        terminal closed it (a read then fails with EIO)."""
        os.close(self.slave)
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except BlockingIOError:
                await anyio.wait_readable(self.master)
                continue
            except OSError:  # EIO: the slave side is closed everywhere
                break
            self.screen.write(chunk)
        self.screen.close()
        os.close(self.master)


@contextlib.asynccontextmanager
async def on_terminal(
    *argv: str, launcher: Sequence[str] | None = None
) -> AsyncIterator[tuple[anyio.abc.Process, Terminal]]:
    """Run ``aioelastic run ARGV`` (or ``LAUNCHER ARGV``) with a pseudo-terminal as its stdin,
    stdout and stderr; kill it at the end if it still runs."""
    program = [sys.executable, "-m", "aioelastic", "run"] if launcher is None else launcher
    terminal = Terminal()
    slave = terminal.slave
    process = await anyio.open_process([*program, *argv], stdin=slave, stdout=slave, stderr=slave)
    async with anyio.create_task_group() as tg:
        tg.start_soon(terminal.read)
        try:
            yield process, terminal
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
            tg.cancel_scope.deadline = anyio.current_time() + 5  # a stray may hold the terminal
    await process.aclose()
