"""The handler contract every rendezvous backend implements."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskStatus

from aioelastic.rendezvous._info import RendezvousInfo, RoundInvalidated


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

    @abc.abstractmethod
    async def wait_round_invalidated(self) -> RoundInvalidated:
        """Return as soon as the round this handler last completed is no longer valid."""

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
