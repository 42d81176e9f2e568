"""The ``async with`` half of every Service: serve in an owned task group, stop on exit."""

from __future__ import annotations

import errno
import socket
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup, TaskStatus

from aioelastic._service import Service
from aioelastic.store import TCPStoreServer

pytestmark = pytest.mark.anyio


class Recorder(Service):
    """Records how its serve() ran; fails to start when told to."""

    def __init__(self, *, fail: bool = False, graceful: bool = False) -> None:
        self.fail = fail
        self.graceful = graceful
        self.stop = anyio.Event()
        self.log: list[str] = []

    async def serve(self, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        if self.fail:
            raise ValueError("cannot start")
        self.log.append("started")
        task_status.started()
        try:
            await self.stop.wait()
            self.log.append("stopped")
        except anyio.get_cancelled_exc_class():
            self.log.append("cancelled")
            raise

    def _stop_serving(self, group: TaskGroup) -> None:
        if self.graceful:
            self.stop.set()
        else:
            super()._stop_serving(group)


async def test_enter_waits_until_ready_and_exit_cancels() -> None:
    """``async with`` returns once serve() is ready; leaving the block cancels serve()."""
    service = Recorder()
    async with service as entered:
        assert entered is service
        assert service.log == ["started"]
    assert service.log == ["started", "cancelled"]


async def test_stop_hook_lets_serve_return_on_its_own() -> None:
    """A subclass's _stop_serving replaces cancellation with its own stop."""
    service = Recorder(graceful=True)
    async with service:
        pass
    assert service.log == ["started", "stopped"]


async def test_failure_to_start_propagates_unwrapped() -> None:
    """An error raised before serve() is ready comes out of ``async with`` as itself."""
    with pytest.raises(ValueError, match="cannot start"):
        async with Recorder(fail=True):
            pass


async def test_exit_without_enter_is_an_error() -> None:
    """Exiting a service that was never entered says so."""
    with pytest.raises(RuntimeError, match="Recorder was exited without being entered"):
        await Recorder().__aexit__(None, None, None)


async def test_a_cancelled_block_keeps_its_service_until_the_block_ends() -> None:
    """Cancelling a scope around the block stops serve() at the block's end, not before: the
    block's own shielded clean-up (a handler's goodbye through its store) still has it."""
    service = Recorder()
    during_cleanup: list[str] = []
    with anyio.CancelScope() as outer:
        async with service:
            outer.cancel()
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.wait_all_tasks_blocked()  # serve() has had its chance to run
                    during_cleanup.extend(service.log)
    assert during_cleanup == ["started"]
    assert service.log == ["started", "cancelled"]


class NeverReady(Service):
    """Never says it is ready (a store that cannot connect)."""

    async def serve(self, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        await anyio.sleep_forever()


async def test_starting_stays_cancellable() -> None:
    """A service is shielded only once started: a cancelled scope ends a start that hangs."""
    with anyio.CancelScope() as outer:
        outer.cancel()
        async with NeverReady():
            pytest.fail("a service that never started cannot be entered")
    assert outer.cancelled_caught


async def test_error_in_the_block_leaves_as_itself() -> None:
    """The block's own error comes out of ``async with`` as itself, not in an exception group."""
    with pytest.raises(KeyError, match="from the block"):
        async with Recorder():
            raise KeyError("from the block")


async def test_failure_inside_serves_own_task_group_leaves_as_itself() -> None:
    """An error raised in serve()'s own task group before it is ready is unwrapped too."""

    class Nested(Recorder):
        async def serve(self, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
            async with anyio.create_task_group():
                raise ValueError("cannot bind")

    with pytest.raises(ValueError, match="cannot bind"):
        async with Nested():
            pass


async def test_tcp_store_server_on_a_busy_port_raises_oserror() -> None:
    """``async with TCPStoreServer(...)`` on a port in use raises OSError (EADDRINUSE)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=r"(?i)address already in use") as caught:
            async with TCPStoreServer("127.0.0.1", port):
                pass
    assert caught.value.errno == errno.EADDRINUSE


async def test_close_from_another_task_stops_serve_alone() -> None:
    """_close_service() from another task stops serve() and returns once it has; the block
    itself is not cancelled, and its exit is clean."""
    service = Recorder()
    went_on = False
    async with service:
        async with anyio.create_task_group() as tg:
            tg.start_soon(service._close_service)
        assert service.log == ["started", "cancelled"]
        await anyio.lowlevel.checkpoint()
        went_on = True
    assert went_on
    assert service.log == ["started", "cancelled"]


async def test_close_in_the_entering_task_then_the_blocks_end_is_clean() -> None:
    """Closing in the task that entered exits at once; leaving the block afterwards is no error."""
    service = Recorder()
    async with service:
        await service._close_service()
        assert service.log == ["started", "cancelled"]
