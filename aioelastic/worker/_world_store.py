"""An async world's store: a prefix of the job's store whose waits end when the world does.

A survivor awaiting a key that a dead peer was to write would otherwise wait out the store's
timeout (and be restarted by its agent for not leaving the world in time). Each wait races
:meth:`World.wait_changed`; if the world ends first, the wait is cancelled (our client then
withdraws it from the server) and :class:`~aioelastic.worker.WorldChanged` is raised, which
``async with world:`` turns into the next world. The sync twin is
:meth:`~aioelastic.store.BlockingTCPStore.scoped`'s ``interrupt``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, NoReturn, TypeVar

from aioelastic._concurrency import first_of
from aioelastic.store import PrefixStore, Store

if TYPE_CHECKING:
    from aioelastic.worker._world import World

T = TypeVar("T")


class WorldStore(PrefixStore):
    """``store`` under ``prefix``, its waits ended by the end of ``world``."""

    def __init__(self, prefix: str, store: Store, world: World) -> None:
        super().__init__(prefix, store)
        self._world = world

    async def _ended(self) -> NoReturn:
        raise await self._world.wait_changed()

    async def _until_ended(self, call: Callable[[], Awaitable[T]]) -> T:
        return await first_of(call, self._ended)

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        return await self._until_ended(partial(super().get, key, timeout=timeout))

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self._until_ended(partial(super().wait, keys, timeout=timeout))

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        return await self._until_ended(partial(super().multi_get, keys, timeout=timeout))

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        call = partial(super().wait_for_change, prefix, after=after, timeout=timeout)
        return await self._until_ended(call)
