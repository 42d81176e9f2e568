"""FileTimerServer over a real FIFO with real worker processes; time driven by a ManualClock."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.testing import ManualClock
from aioelastic.timer import (
    PIPE_BUF,
    FileTimerServer,
    ProcessExited,
    RejectReason,
    RequestRejected,
    TimerAcquired,
    TimerConfigError,
    TimerExpired,
    TimerReaped,
    TimerReleased,
    TimerRequest,
    WatchPolicy,
    encode_request,
)

from .conftest import Recorder, Spawn, arm, read_line, wait_exit, write_raw

pytestmark = pytest.mark.anyio

CHILD_WITH_TIMER = """
import sys
from aioelastic import timer
timer.configure(timer.FileTimerClient(sys.argv[1]))
with timer.expires(after=float(sys.argv[2]), scope=sys.argv[3]):
    print("armed", flush=True)
    sys.stdin.read()
"""


class WallClock:
    """A wall clock tests can step: the manual monotonic clock plus an adjustable offset."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.offset = 1_700_000_000.0

    def __call__(self) -> float:
        return self.clock.now() + self.offset


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def wall(clock: ManualClock) -> WallClock:
    return WallClock(clock)


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timer.fifo")


def server_for(
    fifo: str, recorder: Recorder, clock: ManualClock, **options: Any
) -> FileTimerServer:
    return FileTimerServer(fifo, "test", on_event=recorder, clock=clock, **options)


def exists(path: str) -> bool:
    return os.path.exists(path)


# -- the FIFO ------------------------------------------------------------------------------


async def test_fifo_is_private_and_removed_on_exit(fifo: str) -> None:
    """The FIFO exists with mode 0600 while serving and is gone afterwards."""
    async with FileTimerServer(fifo, "test"):
        mode = os.stat(fifo).st_mode
        assert stat.S_ISFIFO(mode)
        assert stat.S_IMODE(mode) == 0o600
    assert not exists(fifo)


async def test_no_path_means_a_private_directory() -> None:
    """With file_path=None the FIFO lives in a new 0700 directory removed on exit."""
    async with FileTimerServer(None, "test") as server:
        directory = os.path.dirname(server.file_path)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert not exists(directory)


async def test_existing_regular_file_is_refused(fifo: str) -> None:
    """A non-FIFO at the path is left alone and reported."""
    with open(fifo, "w") as file:  # noqa: ASYNC230 - a tiny local file
        file.write("precious")
    with pytest.raises(TimerConfigError, match="exists and is not a FIFO"):
        async with FileTimerServer(fifo, "test"):
            pass
    with open(fifo) as file:  # noqa: ASYNC230 - a tiny local file
        assert file.read() == "precious"


async def test_stale_fifo_is_replaced(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """A FIFO left by a dead server is replaced and the new one serves."""
    os.mkfifo(fifo)
    worker = spawn()
    async with server_for(fifo, recorder, clock):
        arm(fifo, worker.pid, "s", time.time() + 60)
        await recorder.wait_count(TimerAcquired, 1)
    assert not exists(fifo)


async def test_serve_runs_in_the_callers_task_group(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """``await tg.start(server.serve)`` returns once the FIFO accepts requests."""
    worker = spawn()
    server = server_for(fifo, recorder, clock)
    async with anyio.create_task_group() as group:
        await group.start(server.serve)
        arm(fifo, worker.pid, "s", time.time() + 60)
        await recorder.wait_count(TimerAcquired, 1)
        group.cancel_scope.cancel()
    assert not exists(fifo)


async def test_log_event_gets_torchs_event_names(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """log_event gets torch's names: watchdog started, timer expired, kill worker process..."""
    names: list[tuple[str, TimerRequest | None]] = []
    worker = spawn()
    async with FileTimerServer(
        fifo,
        "test",
        log_event=lambda name, req: names.append((name, req)),
        on_event=recorder,
        clock=clock,
    ):
        arm(fifo, worker.pid, "s", time.time() + 5)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(10)
        await recorder.wait_count(TimerReaped, 1)
    assert [n for n, _ in names] == [
        "watchdog started",
        "timer expired",
        "kill worker process",
        "watchdog stopped",
    ]
    assert names[1][1] is not None
    assert (names[1][1].scope_id, names[1][1].worker_pid) == ("s", worker.pid)


# -- expiry and reaping ----------------------------------------------------------------------


async def test_expired_worker_is_killed_with_sigkill(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """A real worker whose timer (from our client) expires dies by SIGKILL; the event names it."""
    async with server_for(fifo, recorder, clock):
        worker = spawn(CHILD_WITH_TIMER, fifo, "30", "train-step")
        assert await read_line(worker) == b"armed\n"
        [acquired] = await recorder.wait_count(TimerAcquired, 1)
        clock.advance(29)
        assert worker.poll() is None
        clock.advance(2)
        [reaped] = await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(worker) == -signal.SIGKILL
    assert reaped == TimerReaped(
        worker.pid, "train-step", signal.SIGKILL, acquired.deadline, acquired.expiration_time
    )


async def test_valid_timers_are_left_alone(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """Only the worker whose timer expired is reaped; the other keeps its timer and lives."""
    doomed, fine = spawn(), spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, doomed.pid, "a", wall() + 10)
        arm(fifo, fine.pid, "a", wall() + 100)
        await recorder.wait_count(TimerAcquired, 2)
        clock.advance(50)
        await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(doomed) == -signal.SIGKILL
        assert fine.poll() is None
        assert server.statistics().active_timers == 1
    assert [e.pid for e in recorder.of(TimerExpired)] == [doomed.pid]


async def test_a_release_sent_before_the_deadline_is_honoured_at_the_deadline(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """A release still unread in the FIFO when the deadline comes is applied first: no reap."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, worker.pid, "a", wall() + 10)
        await recorder.wait_count(TimerAcquired, 1)
        arm(fifo, worker.pid, "a", -1)  # written, and the deadline passes, before any read
        clock.advance(50)
        await recorder.wait_count(TimerReleased, 1)
        await anyio.wait_all_tasks_blocked()
        assert (server.statistics().expired, server.statistics().active_timers) == (0, 0)
        assert worker.poll() is None


@pytest.mark.parametrize("coalesce", [-0.001, float("nan")])
def test_a_negative_coalescing_window_is_refused(fifo: str, coalesce: float) -> None:
    """``coalesce`` is a duration: below zero (or NaN) is a configuration error."""
    with pytest.raises(TimerConfigError, match="coalesce must be >= 0 seconds"):
        FileTimerServer(fifo, coalesce=coalesce)


async def test_reaping_drops_the_processes_other_timers(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """When a worker is reaped, its later timers go with it (they never expire)."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, worker.pid, "outer", wall() + 20)
        arm(fifo, worker.pid, "inner", wall() + 10)
        await recorder.wait_count(TimerAcquired, 2)
        clock.advance(100)
        await recorder.wait_count(TimerReaped, 1)
        assert server.statistics().active_timers == 0
    assert [e.scope_id for e in recorder.of(TimerExpired)] == ["inner"]


async def test_signal_zero_reports_without_killing(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """A timer armed with signal 0 is reported when it expires and nobody is signalled."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, worker.pid, "report-only", wall() + 1, signal=0)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(2)
        [expired] = await recorder.wait_count(TimerExpired, 1)
        assert expired.signal == 0
        assert server.statistics().reaped == 0
    assert worker.poll() is None


async def test_timer_already_past_expires_at_once(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """An acquire whose expiration time has passed expires without time moving."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall):
        arm(fifo, worker.pid, "late", wall() - 5, signal=0)
        [expired] = await recorder.wait_count(TimerExpired, 1)
    assert expired.late == 5


async def test_rearming_moves_the_deadline(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """Acquiring the same scope again replaces its deadline (earlier or later)."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall):
        arm(fifo, worker.pid, "s", wall() + 100, signal=0)
        arm(fifo, worker.pid, "s", wall() + 10, signal=0)
        await recorder.wait_count(TimerAcquired, 2)
        clock.advance(11)
        [expired] = await recorder.wait_count(TimerExpired, 1)
        clock.advance(200)
        await recorder.wait_count(TimerAcquired, 2)
    assert expired.deadline == 1010
    assert len(recorder.of(TimerExpired)) == 1


async def test_wall_clock_step_does_not_move_deadlines(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """After acquire, stepping the wall clock either way neither fires nor postpones the timer."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall):
        arm(fifo, worker.pid, "s", wall() + 30, signal=0)
        await recorder.wait_count(TimerAcquired, 1)
        wall.offset += 3600
        clock.advance(29)
        # A probe due at once: everything due by now expires with it, in deadline order.
        arm(fifo, worker.pid, "probe", wall() - 1, signal=0)
        await recorder.wait_count(TimerExpired, 1)
        assert [e.scope_id for e in recorder.of(TimerExpired)] == ["probe"]
        wall.offset -= 7200
        clock.advance(1)
        expired = await recorder.wait_count(TimerExpired, 2)
    assert (expired[1].scope_id, expired[1].deadline) == ("s", 1030)


async def test_exited_process_timers_are_dropped(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """A worker that exits holding timers has them dropped at once; nothing fires later."""
    async with server_for(fifo, recorder, clock) as server:
        worker = spawn(CHILD_WITH_TIMER, fifo, "30", "held")
        assert await read_line(worker) == b"armed\n"
        await recorder.wait_count(TimerAcquired, 1)
        worker.kill()
        [exited] = await recorder.wait_count(ProcessExited, 1)
        assert server.statistics().active_timers == 0
        assert server.statistics().watched_processes == 0
        clock.advance(60)
    assert exited == ProcessExited(worker.pid, ("held",))
    assert recorder.of(TimerExpired) == []


async def test_release_of_unknown_scope_is_a_no_op(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """Releasing a scope that was never armed changes nothing and raises nothing."""
    worker = spawn()
    async with server_for(fifo, recorder, clock) as server:
        arm(fifo, worker.pid, "held", time.time() + 60)
        arm(fifo, worker.pid, "never-armed", -1)
        arm(fifo, worker.pid + 100000, "nobody", -1)
        await recorder.wait_for(lambda: server.statistics().requests == 3)
        stats = server.statistics()
    assert (stats.active_timers, stats.releases, stats.rejected) == (1, 2, {})
    assert recorder.of(TimerReleased) == []


@pytest.mark.parametrize("coalesce", [None, 0.05])
async def test_ten_processes_ten_nested_timers_lose_nothing(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn, coalesce: float | None
) -> None:
    """10 processes each nesting 10 timers: all 100 acquires and 100 releases arrive, with
    the default gathering window and with one long enough for most processes to exit before
    the server reads what they wrote."""
    code = """
import sys
from contextlib import ExitStack
from aioelastic import timer
client = timer.FileTimerClient(sys.argv[1])
with ExitStack() as stack:
    for depth in range(10):
        stack.enter_context(timer.expires(after=600, scope=f"level-{depth}", client=client))
"""
    options = {} if coalesce is None else {"coalesce": coalesce}
    async with server_for(fifo, recorder, clock, **options) as server:
        workers = [spawn(code, fifo) for _ in range(10)]
        for worker in workers:
            assert await wait_exit(worker) == 0
        await recorder.wait_count(TimerReleased, 100)
        stats = server.statistics()
    assert (stats.acquires, stats.releases, stats.active_timers) == (100, 100, 0)
    for worker in workers:
        mine = [e.scope_id for e in recorder.of(TimerAcquired) if e.pid == worker.pid]
        assert mine == [f"level-{d}" for d in range(10)]


async def test_ten_thousand_timers_expire_in_deadline_order(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """10,000 concurrent timers all expire, each at its own deadline, earliest first."""
    worker = spawn()
    count = 10_000
    lines = [
        TimerRequest(worker.pid, f"s{i}", wall() + 1 + (i * 7919) % count / 100, 0)
        for i in range(count)
    ]
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        for start in range(0, count, 40):
            write_raw(fifo, b"".join(encode_request(r) for r in lines[start : start + 40]))
            if start % 2000 == 0:  # let the server drain the pipe now and then
                await recorder.wait_count(TimerAcquired, start + 40)
        await recorder.wait_count(TimerAcquired, count)
        assert server.statistics().active_timers == count
        clock.advance(50.995)
        await recorder.wait_for(lambda: len(recorder.of(TimerExpired)) >= count // 2)
        assert len(recorder.of(TimerExpired)) == count // 2
        clock.advance(100)
        expired = await recorder.wait_count(TimerExpired, count)
    deadlines = [e.deadline for e in expired]
    assert deadlines == sorted(deadlines)
    assert len({e.scope_id for e in expired}) == count


# -- escalation and hooks --------------------------------------------------------------------

IGNORES_SIGTERM = """
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: print("term", flush=True))
print("ready", flush=True)
sys.stdin.read()
"""


async def test_escalation_sends_sigterm_then_sigkill(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """With kill_grace, SIGTERM goes first; a worker still alive after the grace gets SIGKILL."""
    worker = spawn(IGNORES_SIGTERM)
    assert await read_line(worker) == b"ready\n"
    async with server_for(fifo, recorder, clock, wall_clock=wall, kill_grace=5):
        arm(fifo, worker.pid, "stuck", wall() + 1)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(2)
        assert await read_line(worker) == b"term\n"
        assert worker.poll() is None
        clock.advance(5)
        [reaped] = await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(worker) == -signal.SIGKILL
    assert (reaped.signal, reaped.escalated) == (signal.SIGKILL, True)


async def test_escalation_stops_when_sigterm_suffices(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """A worker that exits on SIGTERM is reported reaped by SIGTERM, without escalation."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall, kill_grace=5):
        arm(fifo, worker.pid, "stuck", wall() + 1)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(2)
        [reaped] = await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(worker) == -signal.SIGTERM
    assert (reaped.signal, reaped.escalated) == (signal.SIGTERM, False)


async def test_before_reap_hook_runs_while_the_worker_is_alive(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """The hook gets the expiry and runs before the kill (for example to dump stacks)."""
    worker = spawn()
    seen: list[tuple[str, bool]] = []

    async def hook(expired: TimerExpired) -> None:
        seen.append((expired.scope_id, worker.poll() is None))

    async with server_for(fifo, recorder, clock, wall_clock=wall, before_reap=hook):
        arm(fifo, worker.pid, "dump-me", wall() + 1)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(2)
        await recorder.wait_count(TimerReaped, 1)
    assert seen == [("dump-me", True)]


async def test_hung_before_reap_hook_cannot_save_the_worker(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """A hook that never returns is abandoned after hook_timeout and the worker is reaped."""
    worker = spawn()
    hook_started = anyio.Event()

    async def hook(expired: TimerExpired) -> None:
        hook_started.set()
        await anyio.sleep_forever()

    async with server_for(fifo, recorder, clock, wall_clock=wall, before_reap=hook, hook_timeout=3):
        arm(fifo, worker.pid, "s", wall() + 1)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(2)
        await hook_started.wait()
        assert worker.poll() is None
        clock.advance(3)
        await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(worker) == -signal.SIGKILL


@pytest.mark.parametrize("option", ["kill_grace", "hook_timeout"])
def test_negative_durations_are_refused(fifo: str, option: str) -> None:
    """A negative kill_grace or hook_timeout is a configuration error naming the value."""
    options: dict[str, Any] = {option: -1}
    with pytest.raises(TimerConfigError, match=f"{option} must be >= 0 seconds, got -1"):
        FileTimerServer(fifo, "test", **options)


# -- safety ----------------------------------------------------------------------------------


async def rejections(recorder: Recorder, count: int) -> list[RequestRejected]:
    return await recorder.wait_count(RequestRejected, count)


@pytest.mark.parametrize("pid", [-5, 0, 1])
async def test_low_and_negative_pids_are_never_watched(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, pid: int
) -> None:
    """Requests for pid <= 1 are dropped as forbidden."""
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, pid, "s", wall() - 1)
        [rejected] = await rejections(recorder, 1)
        assert server.statistics().rejected == {RejectReason.FORBIDDEN_PID: 1}
    assert rejected.pid == pid
    assert "pid <= 1" in rejected.detail


async def test_server_never_watches_itself_or_its_group_leader(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock
) -> None:
    """The server's own pid and its process-group leader are refused; nothing expires."""
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, os.getpid(), "self", wall() - 1, signal=0)
        arm(fifo, os.getpgrp(), "group", wall() - 1, signal=0)
        rejected = await rejections(recorder, 2)
        assert server.statistics().rejected == {RejectReason.FORBIDDEN_PID: 2}
    assert recorder.of(TimerExpired) == []
    assert "own process" in rejected[0].detail


async def test_vanished_pid_is_rejected(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """An acquire for a process that no longer exists is dropped as no such process."""
    gone = spawn()
    gone.kill()
    gone.wait()
    async with server_for(fifo, recorder, clock, wall_clock=wall):
        arm(fifo, gone.pid, "s", wall() + 10)
        [rejected] = await rejections(recorder, 1)
    assert rejected.reason == RejectReason.NO_SUCH_PROCESS


async def test_a_gone_process_that_released_in_the_same_read_loses_nothing(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """A process that acquired, released and exited before the server read either line has
    both honoured (it held the timer when it wrote), and nothing stays armed for it."""
    gone = spawn()
    gone.kill()
    gone.wait()
    acquire = TimerRequest(gone.pid, "s", wall() + 10, 9)
    release = TimerRequest(gone.pid, "s", -1, 9)
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        write_raw(fifo, encode_request(acquire) + encode_request(release))
        [released] = await recorder.wait_count(TimerReleased, 1)
        stats = server.statistics()
    assert released == TimerReleased(gone.pid, "s")
    assert [e.scope_id for e in recorder.of(TimerAcquired)] == ["s"]
    assert recorder.of(RequestRejected) == []
    assert (stats.acquires, stats.releases, stats.active_timers, stats.rejected) == (1, 1, 0, {})


async def test_a_gone_process_keeps_only_the_timers_it_released(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """Of a gone process's acquires read together, the one released later in the read stands
    and the one never released is rejected as no such process (nothing is left to watch)."""
    gone = spawn()
    gone.kill()
    gone.wait()
    lines = [
        TimerRequest(gone.pid, "kept", wall() + 10, 9),
        TimerRequest(gone.pid, "held", wall() + 10, 9),
        TimerRequest(gone.pid, "kept", -1, 9),
    ]
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        write_raw(fifo, b"".join(encode_request(r) for r in lines))
        await recorder.wait_count(TimerReleased, 1)
        [rejected] = await rejections(recorder, 1)
        stats = server.statistics()
    assert [e.scope_id for e in recorder.of(TimerAcquired)] == ["kept"]
    assert (rejected.reason, rejected.pid) == (RejectReason.NO_SUCH_PROCESS, gone.pid)
    assert (stats.acquires, stats.releases, stats.active_timers) == (1, 1, 0)


async def test_pid_policy_leaves_other_processes_alone(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """With WatchPolicy.pids, an unlisted process's timer is refused and it is never signalled."""
    listed, other = spawn(), spawn()
    policy = WatchPolicy.pids({listed.pid})
    async with server_for(fifo, recorder, clock, wall_clock=wall, watch=policy):
        arm(fifo, other.pid, "s", wall() + 1)
        arm(fifo, listed.pid, "s", wall() + 2)
        [rejected] = await rejections(recorder, 1)
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(10)
        [reaped] = await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(listed) == -signal.SIGKILL
    assert (rejected.reason, rejected.pid, reaped.pid) == (
        RejectReason.NOT_WATCHED,
        other.pid,
        listed.pid,
    )
    assert other.poll() is None


SPAWNS_GRANDCHILD = """
import subprocess, sys
code = "import sys; sys.stdin.read()"
child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
"""


async def test_descendants_policy_accepts_grandchildren_only(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """descendants_of(p) admits p's grandchild and refuses a process outside p's tree."""
    parent = spawn(SPAWNS_GRANDCHILD)
    grandchild = int(await read_line(parent))
    outsider = spawn()
    policy = WatchPolicy.descendants_of(parent.pid)
    async with server_for(fifo, recorder, clock, wall_clock=wall, watch=policy):
        arm(fifo, outsider.pid, "s", wall() + 60)
        arm(fifo, grandchild, "s", wall() + 60)
        [rejected] = await rejections(recorder, 1)
        [acquired] = await recorder.wait_count(TimerAcquired, 1)
    assert (rejected.pid, acquired.pid) == (outsider.pid, grandchild)
    assert f"does not descend from pid {parent.pid}" in rejected.detail


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process of another user (``cat`` as nobody: the venv's python is not theirs to run)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user")
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, user="nobody")
    yield proc
    proc.kill()
    proc.communicate()


async def test_default_policy_refuses_other_users(
    fifo: str,
    recorder: Recorder,
    clock: ManualClock,
    wall: WallClock,
    stranger: subprocess.Popen[bytes],
) -> None:
    """By default a process of another user is not watched (and so never signalled)."""
    async with server_for(fifo, recorder, clock, wall_clock=wall):
        arm(fifo, stranger.pid, "s", wall() - 1)
        [rejected] = await rejections(recorder, 1)
    assert rejected.reason == RejectReason.NOT_WATCHED
    assert "runs as uid" in rejected.detail
    assert stranger.poll() is None


# -- bad input -------------------------------------------------------------------------------


async def test_bad_lines_cost_only_themselves(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """Bad lines in one write are dropped and counted by reason; good lines around them apply."""
    worker = spawn()
    good = [encode_request(TimerRequest(worker.pid, f"s{i}", wall() + 60, 0)) for i in range(3)]
    bad = [
        b"{not json\n",
        b"\xff\xfe\n",
        b'{"version": 1, "pid": 5}\n',
        b'{"version": 1, "pid": "x", "scope_id": "s", "expiration_time": 1, "signal": 9}\n',
        b'{"version": 7}\n',
    ]
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        write_raw(fifo, good[0] + b"".join(bad[:3]) + good[1] + b"".join(bad[3:]) + good[2])
        write_raw(fifo, b"z" * (PIPE_BUF + 10) + b"\n")
        await recorder.wait_count(TimerAcquired, 3)
        await recorder.wait_count(RequestRejected, 6)
        stats = server.statistics()
    assert stats.active_timers == 3
    assert stats.rejected == {
        RejectReason.INVALID_JSON: 1,
        RejectReason.NOT_UTF8: 1,
        RejectReason.MISSING_FIELD: 1,
        RejectReason.WRONG_TYPE: 1,
        RejectReason.UNSUPPORTED_VERSION: 1,
        RejectReason.TOO_LONG: 1,
    }


async def test_failing_subscriber_does_not_stop_the_server(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """An exception in one event callback is logged; other subscribers still get events."""
    worker = spawn()

    def broken(event: object) -> None:
        raise RuntimeError("subscriber bug")

    async with FileTimerServer(fifo, "test", on_event=broken, clock=clock) as server:
        unsubscribe = server.subscribe(recorder)
        arm(fifo, worker.pid, "a", time.time() + 60)
        await recorder.wait_count(TimerAcquired, 1)
        unsubscribe()
        arm(fifo, worker.pid, "b", time.time() + 60)
        await recorder_stats(server, 2)
    assert len(recorder.of(TimerAcquired)) == 1


async def recorder_stats(server: FileTimerServer, acquires: int) -> None:
    probe = Recorder()
    unsubscribe = server.subscribe(probe)
    try:
        await probe.wait_for(lambda: server.statistics().acquires >= acquires)
    finally:
        unsubscribe()


async def test_last_progress_time_is_now_when_idle(
    fifo: str, recorder: Recorder, clock: ManualClock
) -> None:
    """An idle server reports progress as of now (nothing is waiting to be handled)."""
    server = server_for(fifo, recorder, clock)
    before = int(time.time())
    assert server.get_last_progress_time() >= before
    async with server:
        assert server.get_last_progress_time() >= before


async def test_reader_sleeps_after_writers_leave(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """After short-lived writers leave, every server task blocks (no EOF spin; exact on trio)."""
    worker = spawn()
    async with server_for(fifo, recorder, clock):
        for i in range(5):
            arm(fifo, worker.pid, f"s{i}", time.time() + 60)  # open, write, close each time
        await recorder.wait_count(TimerAcquired, 5)
        with anyio.fail_after(30):
            await anyio.wait_all_tasks_blocked()


async def test_a_flood_of_bad_lines_is_counted_but_thinly_logged(
    fifo: str, recorder: Recorder, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every bad line is counted and emitted; only the first ten per reason are logged."""
    async with server_for(fifo, recorder, clock) as server:
        write_raw(fifo, b"{broken\n" * 25)
        await recorder.wait_count(RequestRejected, 25)
        stats = server.statistics()
    logged = [r for r in caplog.records if "dropped a request (invalid_json" in r.getMessage()]
    assert stats.rejected == {RejectReason.INVALID_JSON: 25}
    assert len(logged) == 10


async def test_new_server_keeps_its_fifo_when_the_replaced_one_stops(
    fifo: str, recorder: Recorder, clock: ManualClock, spawn: Spawn
) -> None:
    """A server that took over a path keeps serving after the old server there shuts down."""
    worker = spawn()
    old_stopped = anyio.Event()

    def old_log(name: str, request: TimerRequest | None) -> None:
        if name == "watchdog stopped":
            old_stopped.set()

    old = FileTimerServer(fifo, "old", log_event=old_log, clock=clock)
    async with anyio.create_task_group() as group:
        old_scope = anyio.CancelScope()

        async def run_old(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with old_scope:
                await old.serve(task_status=task_status)

        await group.start(run_old)
        async with server_for(fifo, recorder, clock):
            old_scope.cancel()
            await old_stopped.wait()
            assert exists(fifo)
            arm(fifo, worker.pid, "s", time.time() + 60)
            await recorder.wait_count(TimerAcquired, 1)


async def test_fifo_in_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    """A path whose directory does not exist raises a config error naming it."""
    path = str(tmp_path / "missing" / "timer.fifo")
    with pytest.raises(TimerConfigError, match=r"cannot create the FIFO .*No such file"):
        async with FileTimerServer(path, "test"):
            pass


async def test_far_future_deadline_does_not_stall_the_server(
    fifo: str, recorder: Recorder, spawn: Spawn
) -> None:
    """Sleeping toward a deadline 1e300 s away (real loop clock) still wakes for an earlier one."""
    worker = spawn()
    async with FileTimerServer(fifo, "test", on_event=recorder):
        arm(fifo, worker.pid, "far", 1e300, signal=0)
        await recorder.wait_count(TimerAcquired, 1)
        await anyio.wait_all_tasks_blocked()
        arm(fifo, worker.pid, "due", time.time() - 1, signal=0)
        [expired] = await recorder.wait_count(TimerExpired, 1)
    assert expired.scope_id == "due"


async def test_one_server_serves_once_at_a_time(
    fifo: str, recorder: Recorder, clock: ManualClock
) -> None:
    """Starting a server that is already serving is refused with a clear error."""
    async with server_for(fifo, recorder, clock) as server:
        with pytest.raises(RuntimeError, match="FileTimerServer is already serving"):
            await server.serve()


async def test_last_progress_time_stays_put_while_requests_wait(
    fifo: str, recorder: Recorder, clock: ManualClock, wall: WallClock, spawn: Spawn
) -> None:
    """With unread bytes in the FIFO, the progress time is when the server last read, not now."""
    worker = spawn()
    async with server_for(fifo, recorder, clock, wall_clock=wall) as server:
        arm(fifo, worker.pid, "a", wall() + 60)
        await recorder.wait_count(TimerAcquired, 1)
        read_at = int(wall())
        wall.offset += 120
        assert server.get_last_progress_time() == int(wall())  # idle: nothing waits
        arm(fifo, worker.pid, "b", wall() + 60)  # not read yet: no await since the write
        assert server.get_last_progress_time() == read_at
        await recorder.wait_count(TimerAcquired, 2)
        assert server.get_last_progress_time() == int(wall())
