"""Wire compatibility with PyTorch both ways: torch's client against our server, ours against
torch's server (skipped when torch is not importable)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.testing import ManualClock
from aioelastic.timer import (
    FileTimerClient,
    FileTimerServer,
    ProcessExited,
    TimerAcquired,
    TimerReaped,
    TimerReleased,
    TimerRequest,
    encode_request,
)

from .conftest import Recorder, Spawn, read_line, wait_exit

torch_timer = pytest.importorskip(
    "torch.distributed.elastic.timer",
    reason="torch is not importable (CI installs torch==2.13.0 CPU for these tests)",
)

pytestmark = [pytest.mark.anyio, pytest.mark.torch]


@pytest.fixture
def anyio_backend() -> Any:
    """Interop is about bytes on a pipe, not the loop: one backend keeps torch imports few."""
    return ("asyncio", {})


@given(
    st.builds(
        TimerRequest,
        pid=st.integers(-(2**63), 2**63),
        scope_id=st.text(max_size=200),
        expiration_time=st.floats(allow_nan=False, allow_infinity=False),
        signal=st.integers(-64, 64),
    )
)
def test_encoding_matches_torch(request: TimerRequest) -> None:
    """Our bytes equal torch's FileTimerRequest.to_json() plus newline, for any request."""
    theirs = torch_timer.FileTimerRequest(
        request.pid, request.scope_id, request.expiration_time, request.signal
    ).to_json()
    assert encode_request(request) == theirs.encode() + b"\n"
    assert request.to_json() == theirs


TORCH_WORKER = """
import sys
import torch.distributed.elastic.timer as timer
timer.configure(timer.FileTimerClient(sys.argv[1]))
if sys.argv[2] == "hang":
    with timer.expires(after=30, scope="torch-step"):
        print("armed", flush=True)
        sys.stdin.read()
else:
    for i in range(10):
        with timer.expires(after=600, scope=f"outer-{i}"):
            with timer.expires(after=600, scope=f"inner-{i}"):
                pass
"""


async def test_unmodified_torch_client_is_reaped_by_our_server(
    tmp_path: Path, recorder: Recorder, spawn: Spawn
) -> None:
    """A torch worker whose expires() block hangs is SIGKILLed by our server, scope named."""
    fifo = str(tmp_path / "timer.fifo")
    clock = ManualClock(0.0)
    async with FileTimerServer(fifo, "interop", on_event=recorder, clock=clock):
        worker = spawn(TORCH_WORKER, fifo, "hang")
        assert await read_line(worker) == b"armed\n"
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(31)
        [reaped] = await recorder.wait_count(TimerReaped, 1)
        assert await wait_exit(worker) == -signal.SIGKILL
    assert (reaped.pid, reaped.scope_id, reaped.signal) == (worker.pid, "torch-step", 9)


async def test_every_torch_request_reaches_our_server(
    tmp_path: Path, recorder: Recorder, spawn: Spawn
) -> None:
    """Torch's nested acquires and releases all arrive and leave no timer behind."""
    fifo = str(tmp_path / "timer.fifo")
    async with FileTimerServer(fifo, "interop", on_event=recorder) as server:
        worker = spawn(TORCH_WORKER, fifo, "nest")
        assert await wait_exit(worker) == 0
        await recorder.wait_count(ProcessExited, 1)
        stats = server.statistics()
    assert (stats.acquires, stats.releases, stats.active_timers, stats.rejected) == (20, 20, 0, {})
    assert len(recorder.of(TimerReleased)) == 20


async def test_our_client_is_understood_by_torchs_server(tmp_path: Path) -> None:
    """Torch's FileTimerServer registers our client's acquires and releases exactly."""
    fifo = str(tmp_path / "timer.fifo")
    server = torch_timer.FileTimerServer(fifo, "interop", max_interval=0.05)
    server.start()
    client = FileTimerClient(fifo, signal=signal.SIGTERM, connect_timeout=30)
    expiration = time.time() + 3600
    await client.acquire("kept", expiration)
    await client.acquire("dropped", expiration)
    await client.release("dropped")
    await client.release("never-acquired")
    with anyio.fail_after(60):
        await anyio.to_thread.run_sync(server.run_once)
    pid = os.getpid()
    assert server._request_count == 4
    assert server._timers == {
        (pid, "kept"): torch_timer.FileTimerRequest(pid, "kept", expiration, signal.SIGTERM)
    }
