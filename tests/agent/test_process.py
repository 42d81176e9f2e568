"""Worker processes: own session, pidfd exit detection, group signals, no leftovers."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import textwrap
import threading

import anyio
import pytest

from aioelastic.agent import WorkerSpawnError
from aioelastic.agent._guardian import Guardian
from aioelastic.agent._guardian_main import SPAWNING, register_line, unregister_line
from aioelastic.agent._process import WorkerProcess, die_with_agent_prefix
from tests.agent.conftest import BOUND, read_line, wait_gone

pytestmark = pytest.mark.anyio


def spawn_python(code: str, stdout: int | None = None) -> WorkerProcess:
    return WorkerProcess.spawn(
        [sys.executable, "-c", textwrap.dedent(code)], os.environ, stdout=stdout
    )


SLEEPER_WITH_GRANDCHILD = """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(os.getpid(), os.getpgid(0), os.getsid(0), child.pid, flush=True)
    time.sleep(600)
"""


async def test_worker_leads_its_own_session_and_group_signal_reaches_grandchildren() -> None:
    """A worker is session and group leader; a group signal ends it and its grandchild."""
    read_fd, write_fd = os.pipe()
    worker = spawn_python(SLEEPER_WITH_GRANDCHILD, stdout=write_fd)
    os.close(write_fd)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.watch)
            pid, pgid, sid, grandchild = map(int, (await read_line(read_fd)).split())
            worker.signal_group(signal.SIGTERM)
            assert await worker.wait() == -signal.SIGTERM
        await wait_gone(grandchild)
    os.close(read_fd)
    assert (pid, pgid, sid) == (worker.pid, worker.pid, worker.pid)


async def test_grandchildren_left_behind_by_an_exiting_worker_are_killed() -> None:
    """When a worker exits on its own, what remains of its process group is killed."""
    read_fd, write_fd = os.pipe()
    worker = spawn_python(
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
        """,
        stdout=write_fd,
    )
    os.close(write_fd)
    with anyio.fail_after(BOUND):
        grandchild = int(await read_line(read_fd))
        assert await worker.watch() == 0
        await wait_gone(grandchild)
    os.close(read_fd)


async def test_exit_code_and_signal_are_reported() -> None:
    """Exit codes come back as is; death by a signal as minus the signal number."""
    with anyio.fail_after(BOUND):
        assert await spawn_python("raise SystemExit(3)").watch() == 3
        assert await spawn_python("import os; os.kill(os.getpid(), 9)").watch() == -9


async def test_worker_dies_with_a_killed_agent() -> None:
    """SIGKILL of the process that spawned a worker kills the worker too (no orphan)."""
    read_fd, write_fd = os.pipe()
    agent = spawn_python(
        """
        import os, sys, anyio
        from aioelastic.agent._process import WorkerProcess, die_with_agent_prefix
        async def main():
            code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
            w = WorkerProcess.spawn([sys.executable, "-c", code], os.environ)
            await w.watch()
        anyio.run(main)
        """,
        stdout=write_fd,
    )
    os.close(write_fd)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.watch)
            orphan = int(await read_line(read_fd))  # written by the worker: it is running
            agent.signal_group(signal.SIGKILL)
        await wait_gone(orphan)
    os.close(read_fd)


async def test_missing_program_is_a_clear_error() -> None:
    """Starting a program that does not exist names it and says what to check."""
    with pytest.raises(WorkerSpawnError, match=r"could not start worker '/no/such/program'"):
        WorkerProcess.spawn(["/no/such/program"], os.environ)
    with pytest.raises(WorkerSpawnError, match=r"could not start worker 'no-such-command-x'"):
        WorkerProcess.spawn(["no-such-command-x"], os.environ)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_no_thread_per_worker() -> None:
    """Watching several workers on asyncio starts no thread (no child-watcher thread)."""
    before = threading.active_count()
    workers = [spawn_python("import time; time.sleep(600)") for _ in range(4)]
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            for worker in workers:
                tg.start_soon(worker.watch)
            await anyio.lowlevel.checkpoint()
            during = threading.active_count()
            for worker in workers:
                worker.signal_group(signal.SIGKILL)
    assert during == before


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_setpriv_workers_run_unprotected_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No setpriv: workers still start and exit normally; a warning says they are unprotected."""
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, **kw: None if name == "setpriv" else real_which(name, **kw)
    )
    die_with_agent_prefix.cache_clear()
    try:
        with anyio.fail_after(BOUND):
            assert await spawn_python("raise SystemExit(4)").watch() == 4
    finally:
        die_with_agent_prefix.cache_clear()
    assert "workers will outlive an agent killed with SIGKILL" in caplog.text


def pinned(pid: int) -> bool:
    """Whether child ``pid`` still holds its id: running, or exited and not yet reaped."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


class RecordingGuardian(Guardian):
    """A real guardian that also notes each message and whether its group id was pinned."""

    def __init__(self) -> None:
        super().__init__(grace=1.0)
        self.told: list[tuple[bytes, bool | None]] = []

    def _send(self, line: bytes) -> None:
        self.told.append((line, pinned(int(line[1:])) if line[1:-1] else None))
        super()._send(line)


async def test_worker_group_is_registered_then_unregistered_while_its_id_is_pinned() -> None:
    """The guardian hears of a starting worker, then its group; it forgets it before the reap."""
    async with RecordingGuardian() as guardian:
        worker = WorkerProcess.spawn([sys.executable, "-c", "pass"], os.environ, guardian=guardian)
        with anyio.fail_after(BOUND):
            assert await worker.watch() == 0
    assert guardian.told == [
        (SPAWNING, None),
        (register_line(worker.pid), True),
        (unregister_line(worker.pid), True),
    ]
