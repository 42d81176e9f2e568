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

    @abc.abstractmethod
    async def serve(self, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; ``task_status.started()`` once ready for use."""

    def _stop_serving(self, group: TaskGroup) -> None:
        """Make :meth:`serve` return on ``async with`` exit; the default cancels it."""
        group.cancel_scope.cancel()

    async def __aenter__(self) -> Self:
        group = anyio.create_task_group()
        await group.__aenter__()
        try:
            with unwrap_single_error():
                await group.start(self.serve)
        except BaseException:
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)
            raise
        self._service_group = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._service_group = self._service_group, None
        if group is None:
            raise RuntimeError(f"{type(self).__name__} was exited without being entered")
        self._stop_serving(group)
        with unwrap_single_error():
            return await group.__aexit__(exc_type, exc, tb)
