"""Components that run as ``serve()``, in the caller's task group or in one of their own.

Servers, stores with background work and the agent all offer the same two ways to run:
``await task_group.start(obj.serve)`` inside a task group the caller owns, or ``async with obj:``,
which runs ``serve`` in a task group the object owns and stops it on exit. :class:`Service`
writes the second once, on top of the first. That task group is the component's boundary: a
lone error leaves ``async with`` as itself (an ``OSError`` from a busy port, the block's own
error), not wrapped in an exception group.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

from aioelastic._concurrency import unwrap_single_error


class Service(abc.ABC):
    """A component whose work is :meth:`serve`; ``async with`` runs it in a task group it owns."""

    _service_group: TaskGroup | None = None
    _service_owner: object = None
    """The task that entered ``async with`` (only it may exit the task group)."""
    _service_done: anyio.Event | None = None
    """Set once :meth:`serve` has returned."""
    _serve_scope: anyio.CancelScope | None = None
    """Around :meth:`serve` alone, in its task; shielded once started (see ``__aenter__``)."""
    _service_closed = False
    """Whether :meth:`_close_service` already exited the task group (the block's end may come)."""

    @abc.abstractmethod
    async def serve(self, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; ``task_status.started()`` once ready for use."""

    def _stop_serving(self, group: TaskGroup) -> None:
        """Make :meth:`serve` return (on ``async with`` exit, or from any task through
        :meth:`_close_service`); the default cancels it, and it alone: the task group's own
        scope holds the ``async with`` block too."""
        assert self._serve_scope is not None
        self._serve_scope.cancel()

    async def __aenter__(self) -> Self:
        group = anyio.create_task_group()
        await group.__aenter__()
        done, self._serve_scope = anyio.Event(), anyio.CancelScope()
        try:
            with unwrap_single_error():
                await group.start(self._serve_then_set, self._serve_scope, done)
        except BaseException:
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)
            raise
        # From here on it serves until the block ends, even while a scope around the block is
        # cancelled: the block's own clean-up (a rendezvous handler's goodbye, shielded) still
        # has its store. Starting stays cancellable (a store that cannot connect).
        self._serve_scope.shield = True
        self._service_group, self._service_done = group, done
        self._service_owner = anyio.get_current_task().id
        return self

    async def _serve_then_set(
        self,
        scope: anyio.CancelScope,
        done: anyio.Event,
        *,
        task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with scope:
                await self.serve(task_status=task_status)
        finally:
            done.set()

    async def _close_service(self) -> None:
        """Stop what ``async with`` started, from any task (``aclose()`` is built on this).

        The entering task exits the task group at once. Another task (a task group's exit is
        its entering task's alone) stops :meth:`serve` and returns once it has, leaving the exit
        of the emptied task group to the ``async with`` block's end.
        """
        group, done = self._service_group, self._service_done
        if group is None or done is None:
            return
        if anyio.get_current_task().id == self._service_owner:
            await Service.__aexit__(self, None, None, None)
            self._service_closed = True  # the block's end has nothing left to exit
        else:
            self._stop_serving(group)
            await done.wait()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._service_group = self._service_group, None
        if group is None:
            if self._service_closed:
                return None
            raise RuntimeError(f"{type(self).__name__} was exited without being entered")
        self._stop_serving(group)
        with unwrap_single_error():
            return await group.__aexit__(exc_type, exc, tb)
