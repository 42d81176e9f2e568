"""The FIFO timer server against hostile lines: each costs only itself, the server keeps serving."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from aioelastic.testing import ManualClock
from aioelastic.timer import (
    FileTimerServer,
    RejectReason,
    RequestRejected,
    TimerAcquired,
    TimerExpired,
    decode_line,
)
from tests.timer.conftest import Recorder, Spawn, arm, write_raw

pytestmark = pytest.mark.anyio

WALL = 1_700_000_000.0


def wall_clock(clock: ManualClock) -> float:
    return clock.now() + WALL


@pytest.fixture
def served(tmp_path: Path, recorder: Recorder) -> tuple[str, FileTimerServer]:
    """A FIFO path and a server on it, on a manual clock, reporting to ``recorder``."""
    clock = ManualClock(1000.0)
    fifo = str(tmp_path / "timer.fifo")
    server = FileTimerServer(
        fifo, "t", on_event=recorder, clock=clock, wall_clock=lambda: wall_clock(clock)
    )
    return fifo, server


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
def test_deeply_nested_json_is_rejected_not_raised(opener: bytes) -> None:
    """A line nesting JSON deeper than the interpreter recurses is an invalid-JSON rejection."""
    line = opener * (4000 // len(opener))
    decoded = decode_line(line)
    assert getattr(decoded, "reason", None) == RejectReason.INVALID_JSON


@pytest.mark.parametrize("signum", [signal.NSIG, 2**31, 2**70])
def test_signal_beyond_the_signal_range_is_rejected(signum: int) -> None:
    """An acquire whose signal is no signal number is dropped on arrival, as a bad value."""
    line = (
        b'{"version": 1, "pid": 5, "scope_id": "s", "expiration_time": 10.0, "signal": '
        + str(signum).encode()
        + b"}"
    )
    decoded = decode_line(line)
    assert getattr(decoded, "reason", None) == RejectReason.BAD_VALUE
    assert "signal" in getattr(decoded, "detail", "")


@pytest.mark.parametrize("pid", [2**31, 2**40, 2**70])
async def test_huge_pid_is_no_such_process_and_the_server_keeps_serving(
    served: tuple[str, FileTimerServer], recorder: Recorder, spawn: Spawn, pid: int
) -> None:
    """An acquire for a pid no kernel can have is dropped; a later valid acquire still works."""
    fifo, server = served
    worker = spawn()
    async with server:
        arm(fifo, pid, "huge", WALL + 2000)
        arm(fifo, worker.pid, "ok", WALL + 2000, signal=0)
        await recorder.wait_count(TimerAcquired, 1)
    [rejected] = recorder.of(RequestRejected)
    assert (rejected.reason, rejected.pid) == (RejectReason.NO_SUCH_PROCESS, pid)


async def test_deep_json_over_the_fifo_keeps_the_server_serving(
    served: tuple[str, FileTimerServer], recorder: Recorder, spawn: Spawn
) -> None:
    """A deeply nested line written to the FIFO is rejected and the next line is served."""
    fifo, server = served
    worker = spawn()
    async with server:
        write_raw(fifo, b"[" * 3000 + b"\n")
        arm(fifo, worker.pid, "ok", WALL + 2000, signal=0)
        await recorder.wait_count(TimerAcquired, 1)
        assert server.statistics().rejected == {RejectReason.INVALID_JSON: 1}


async def test_signal_out_of_range_never_reaches_the_reaper(
    served: tuple[str, FileTimerServer], recorder: Recorder, spawn: Spawn
) -> None:
    """An expired timer whose signal is out of range was never armed; the process lives on."""
    fifo, server = served
    worker = spawn()
    async with server:
        arm(fifo, worker.pid, "bad", WALL - 1, signal=2**40)
        arm(fifo, worker.pid, "ok", WALL - 1, signal=0)
        [expired] = await recorder.wait_count(TimerExpired, 1)
        assert expired.scope_id == "ok"
        assert server.statistics().rejected == {RejectReason.BAD_VALUE: 1}
    assert worker.poll() is None
