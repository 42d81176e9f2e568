"""The handler contract every rendezvous backend implements."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskStatus

from aioelastic.rendezvous._info import InvalidationReason, RendezvousInfo, RoundInvalidated

DEFAULT_MONITOR_INTERVAL = 0.1
"""torchrun's ``--monitor-interval`` default: how often torch's agent asks a handler whether the
round still holds."""


async def _ask(method: Callable[[], Any]) -> Any:
    """Call a handler method written either way: ours are coroutines; torch's are plain
    methods that may block on their store, so they run in a worker thread."""
    if inspect.iscoroutinefunction(method):
        return await method()
    return await anyio.to_thread.run_sync(method)


class RendezvousHandler(abc.ABC):
    """One node's view of a job's rendezvous; use it as ``async with handler:``.

    Entering connects (and starts background work such as keep-alives); leaving calls
    :meth:`shutdown`, which leaves the rendezvous without closing it for the other nodes.
    """

    @property
    def use_agent_store(self) -> bool:
        """Whether this backend's own store is handed to workers as torch's: never.

        The elastic agent serves its workers a torch-protocol store itself, whatever the backend
        (``TORCHELASTIC_USE_AGENT_STORE=True``: see ``aioelastic.agent._worker_store``).
        """
        return False

    @abc.abstractmethod
    def get_backend(self) -> str:
        """The name of the backend this handler implements (``c10d``, ``static``, ...)."""

    @abc.abstractmethod
    def get_run_id(self) -> str:
        """The run id of the job."""

    @abc.abstractmethod
    async def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return this node's place in it, once it completes."""

    @abc.abstractmethod
    async def is_closed(self) -> bool:
        """Whether the rendezvous was closed (the job is over)."""

    @abc.abstractmethod
    async def set_closed(self) -> None:
        """Close the rendezvous for every node: waiting and later joins fail as closed."""

    @abc.abstractmethod
    async def num_nodes_waiting(self) -> int:
        """How many nodes wait to join the next round (a positive value asks for a re-round)."""

    monitor_interval: float = DEFAULT_MONITOR_INTERVAL
    """Seconds between two looks of the default :meth:`wait_round_invalidated`."""

    async def wait_round_invalidated(self) -> RoundInvalidated:
        """Return as soon as the round this handler last completed is no longer valid.

        Torch's interface has no such method: its agent asks :meth:`is_closed` and
        :meth:`num_nodes_waiting` every monitor interval. This default does the same every
        :attr:`monitor_interval` seconds, so a handler implementing torch's seven methods
        (plain or ``async``) works unchanged; our backends override it and are woken by their
        store instead.
        """
        while True:
            if await _ask(self.is_closed):
                detail = f"run {self.get_run_id()!r} was closed"
                return RoundInvalidated(InvalidationReason.CLOSED, detail)
            waiting = int(await _ask(self.num_nodes_waiting))
            if waiting > 0:
                detail = f"{waiting} node{'s' if waiting > 1 else ''} waiting to join"
                return RoundInvalidated(InvalidationReason.NODES_WAITING, detail)
            await anyio.sleep(self.monitor_interval)  # torch's monitor loop: nothing to wait on

    @abc.abstractmethod
    async def shutdown(self) -> bool:
        """Leave the rendezvous without closing it for others; return whether it went cleanly."""

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the handler in the caller's task group until cancelled.

        ``await tg.start(handler.serve)`` returns once the handler is connected; cancelling
        the task leaves the rendezvous as ``async with`` would.
        """
        async with self:
            task_status.started()
            await anyio.sleep_forever()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()
