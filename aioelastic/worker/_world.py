"""``worker.worlds()``: one :class:`World` per generation this process has a place in.

Under ``aioelastic run --recovery in-place`` the agent links each worker to itself (see
``_protocol.py``): :func:`worlds` says hello, then yields each world the agent assigns, until
the job is done. A world ends when a member fails, a node is lost or joins; ``with world:``
turns an exception caused by that end into leaving the world (the loop goes on to the next
one), while an exception of a world that is still valid propagates: the worker fails as it
would without the API. Anywhere else (``--recovery restart``, torchrun, or no launcher at
all) :func:`worlds` yields exactly one world made from torch's environment variables, so the
same script runs everywhere.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aioelastic._process_group import destroy_default_process_group
from aioelastic.store import BlockingTCPStore, PrefixStore, TCPStore
from aioelastic.worker import _preemption, _warm
from aioelastic.worker._abort import AbortWatch
from aioelastic.worker._link import AgentLinkError, Link
from aioelastic.worker._protocol import Enter, Hello, Trouble, WorldAssigned
from aioelastic.worker._steps import marks
from aioelastic.worker._world_store import WorldStore

if TYPE_CHECKING:
    from aioelastic.store import Store

logger = logging.getLogger("aioelastic.worker")

DEFAULT_TIMEOUT = 1800.0
"""A world's collective timeout without an agent (torch's default for gloo: 30 minutes)."""


class WorldChanged(Exception):
    """The world this worker was in ended (``world.check()`` raises it at a step boundary)."""

    def __init__(self, generation: int, reason: str) -> None:
        super().__init__(f"generation {generation} of the world ended: {reason}")
        self.generation = generation
        self.reason = reason


class World:
    """This process's place in one generation of the job's world.

    ``rank``/``world_size``/``local_rank`` are this generation's (ranks are dense; a survivor
    keeps its rank where it can). ``generation`` strictly increases within a job. ``is_fresh``
    says this process holds none of the previous generation's state (a spare or a
    replacement): it receives it from ``source_rank``; ``fresh_ranks`` lists every such rank,
    so the others know to send. ``store`` is a store for this generation only (pass it to
    ``init_process_group``); ``timeout`` is what a collective may block before it raises.
    """

    def __init__(self, assigned: WorldAssigned, link: Link | None) -> None:
        self.generation = assigned.generation
        self.rank = assigned.rank
        self.world_size = assigned.world_size
        self.local_rank = assigned.local_rank
        self.is_fresh = assigned.is_fresh
        self.source_rank = assigned.source_rank
        self.fresh_ranks = assigned.fresh_ranks
        self.timeout = datetime.timedelta(seconds=assigned.timeout)
        self._store_spec = assigned.store
        self._store: Any = None
        self._client: Store | None = None
        self._link = link
        self._asked = False
        self._abort: AbortWatch | None = None
        self.ended: str | None = None
        """Why this world ended, once this process knows it did."""

    @property
    def round(self) -> int:
        """The rendezvous round of the agents this world belongs to (``AIOELASTIC_ROUND``)."""
        return int(os.environ.get("AIOELASTIC_ROUND", "0"))

    @property
    def store(self) -> Any:
        """A ``torch.distributed.Store`` scoped to this generation (created on first use).

        Without torch it is an aioelastic store, scoped the same way (the keys are the same
        ones, so workers with and without torch meet): a
        :class:`~aioelastic.store.BlockingTCPStore` for sync workers, and for async workers,
        inside ``async with world:``, an async :class:`~aioelastic.store.Store`.
        """
        if self._store is None:
            if _has_torch():
                self._store = _open_store(self._store_spec, self)
            else:
                self._store = _open_blocking_store(self._store_spec, self)
        return self._store

    def init_process_group(self, backend: str = "gloo", **options: Any) -> None:
        """``torch.distributed.init_process_group`` for this world: its store, rank, size and
        timeout (``options`` go to torch as they are and win)."""
        import torch.distributed as dist

        kwargs: dict[str, Any] = {
            "store": self.store,
            "rank": self.rank,
            "world_size": self.world_size,
            "timeout": self.timeout,
        }
        dist.init_process_group(backend, **{**kwargs, **options})

    # -- step marks (see _steps.py) -------------------------------------------------------------

    def step(self, n: int) -> None:
        """Mark that step ``n`` begins now (goodput and stragglers; about a microsecond, no
        I/O: marks go to the agent in batches; a no-op without ``aioelastic run``). Like
        :meth:`check`, it reports the loaded modules once for the spares."""
        if self._link is not None:
            _warm.at_step(self._link)
        marks().mark(self.generation, self.rank, n)

    def work_done(self) -> None:
        """Mark that this rank finished its own work of the current step: call it just before
        the step's collective, so a rank's step time excludes waiting for slower peers."""
        marks().work_done(self.generation, self.rank)

    def saving_checkpoint(self) -> AbstractContextManager[None]:
        """``with world.saving_checkpoint():`` marks a checkpoint save (badput, not training)."""
        return marks().saving(self.generation, self.rank)

    def should_stop(self, step: int) -> bool:
        """Whether to save and return at boundary ``step``: True on every rank of the job at the
        same step once any node is preempted (see ``_preemption.py``), else False, cheaply.
        It marks step ``step`` as :meth:`step` does."""
        self.step(step)
        return _preemption.should_stop(self.rank, step)

    # -- has it ended? ------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`WorldChanged` if this world ended; otherwise return at once. Under an
        agent, once the modules stopped growing from one call to the next, it also reports them
        (once) so that the spares import them (see ``_warm.py``)."""
        if self._link is not None:
            _warm.at_step(self._link)  # once: the modules a spare should hold (see _warm.py)
        reason = self._end_reason()
        if reason is not None:
            raise WorldChanged(self.generation, reason)

    async def wait_changed(self) -> WorldChanged:
        """Wait until this world ends; return the exception :meth:`check` would raise."""
        link = self._require_link()
        while (reason := self._end_reason()) is None:
            await link.wait_async()
        return WorldChanged(self.generation, reason)

    def _end_reason(self) -> str | None:
        if self.ended is None and self._link is not None:
            self._link.poll()
            self.ended = self._link.end_of(self.generation)
        return self.ended

    def _require_link(self) -> Link:
        if self._link is None:
            raise AgentLinkError(
                "this world has no agent to end it (not under aioelastic run --recovery in-place)"
            )
        return self._link

    # -- with world: ------------------------------------------------------------------------

    def __enter__(self) -> World:
        if self._link is not None:
            self._abort = AbortWatch.start(self.generation, self._store_spec, self._forget_store)
            self._link.send(Enter(self.generation))
        return self

    def _forget_store(self) -> None:
        """The abort shut down the store connection (see _abort.py): the next world opens one."""
        spec = self._store_spec
        _TORCH_CLIENTS.pop((str(spec.get("host")), int(spec.get("port") or 0)), None)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        # The process group goes after the verdict: destroying it first would break the
        # peers' collectives and make them ask too, while this world is still valid.
        try:
            if error is None or not isinstance(error, Exception):
                return False
            if isinstance(error, WorldChanged):
                self.ended = error.reason
                return True
            link = self._link
            if link is not None and self._end_reason() is None:
                self._ask(link, error)
                while self._end_reason() is None and self.generation not in link.valid:
                    link.wait()
            return self._left(error)
        finally:
            marks().flush()  # this world's marks go now, not with the next world's
            if self._abort is not None:
                self._abort.stop()
            destroy_default_process_group()
            if isinstance(self._store, BlockingTCPStore):
                self._store.close()  # a view (its connection serves the next generation too)

    async def __aenter__(self) -> World:
        if self._store is None and not _has_torch():
            # One connection per world: an async client's task group belongs to the task and
            # the block that opened it, so it cannot outlive ``async with world:``.
            try:
                host, port, prefix = _aioelastic_address(self._store_spec, self)
            except AgentLinkError:
                return self.__enter__()  # no store to open: world.store says why, if asked
            self._client = TCPStore(host, port, timeout=self.timeout.total_seconds())
            await self._client.__aenter__()
            if self._link is None:
                self._store = PrefixStore(prefix, self._client)
            else:  # its waits end when the world does
                self._store = WorldStore(prefix, self._client, self)
        return self.__enter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            link = self._link
            if isinstance(error, Exception) and not isinstance(error, WorldChanged) and link:
                if self._end_reason() is None:
                    self._ask(link, error)
                while self._end_reason() is None and self.generation not in link.valid:
                    await link.wait_async()
            return self.__exit__(kind, error, tb)
        finally:
            if self._client is not None:
                await self._client.aclose()

    def _ask(self, link: Link, error: BaseException) -> None:
        """Ask the agent (once) whether this world ended, as ``error`` suggests it might."""
        if not self._asked:
            self._asked = True
            link.send(Trouble(self.generation, f"{type(error).__name__}: {error}"[:1000]))

    def _left(self, error: BaseException) -> bool:
        """Swallow ``error`` if this world ended (it is the end's doing), else let it go."""
        if self.ended is None:
            return False
        logger.info(
            "generation %d ended (%s); left it on %s", self.generation, self.ended, type(error)
        )
        return True

    def __repr__(self) -> str:
        return (
            f"World(generation={self.generation}, rank={self.rank}, "
            f"world_size={self.world_size}, is_fresh={self.is_fresh})"
        )


# -- the loops ----------------------------------------------------------------------------------


def worlds() -> Iterator[World]:
    """Yield this process's world, one per generation, until the job is done (blocks between).

    Leaving a world's ``with`` block normally (the training finished) ends the loop; leaving it
    because the world ended waits for the next generation.
    """
    link = _say_hello()
    try:
        if link is None:
            yield _world_from_env()
            return
        while True:
            while (assigned := link.next_world()) is None and link.no_more is None:
                if not _warm.while_idle(link):  # a spare imports what the workers hold
                    link.wait()
            if assigned is None:
                return
            world = World(assigned, link)
            _note_in_environment(world)
            with _leaving_warned(world):
                yield world
            if world._end_reason() is None:
                return
    finally:
        _close_blocking_stores()


async def async_worlds() -> AsyncIterator[World]:
    """:func:`worlds` for async workers: waits on the event loop, never blocks it."""
    link = _say_hello()
    if link is None:
        yield _world_from_env()
        return
    while True:
        while (assigned := link.next_world()) is None and link.no_more is None:
            if not _warm.while_idle(link):  # a spare imports what the workers hold
                await link.wait_async()
        if assigned is None:
            return
        world = World(assigned, link)
        _note_in_environment(world)
        with _leaving_warned(world):
            yield world
        if world._end_reason() is None:
            return


LEFT_AN_ENDED_WORLD = (
    "this rank left worker.worlds() after generation %d ended under it (%s), so the job, "
    "which expects it in the next generation, falls back to a restart: leave the loop only "
    "when training is done, with the `break` (or return) inside `with world:` after training "
    "returns; a world that ends leaves that block before reaching it"
)


@contextmanager
def _leaving_warned(world: World) -> Iterator[None]:
    """Say so when the caller leaves the loop right after ``world`` ended under it (a
    ``break`` after ``with world:``): the agent only sees a rank exit 0 while the next
    generation forms."""
    try:
        yield
    except GeneratorExit:
        if world.ended is not None:  # known, not asked: the link may be gone by now
            logger.warning(LEFT_AN_ENDED_WORLD, world.generation, world.ended)
        raise


_LINK: Link | None = None

SPARE_ENV = "AIOELASTIC_SPARE"
"""Set (to ``1``) in a spare's environment until it is placed; its ranks there are ``-1``."""


def _note_in_environment(world: World) -> None:
    """Make torch's variables say this process's place in ``world`` (a spare's said it held
    none; a survivor's rank or the world's size may have changed), for code that reads them."""
    os.environ.update(
        RANK=str(world.rank),
        LOCAL_RANK=str(world.local_rank),
        WORLD_SIZE=str(world.world_size),
        ROLE_RANK=str(world.rank),
        ROLE_WORLD_SIZE=str(world.world_size),
    )
    os.environ.pop(SPARE_ENV, None)


def _say_hello() -> Link | None:
    """This process's link to its agent (set up once, reused by a later loop), having asked
    for a world on it; None without an agent."""
    global _LINK
    if _LINK is None:
        _LINK = Link.from_env()
    marks()  # claims the step-marks socket: a child started from now on is not linked
    if _LINK is not None:
        _LINK.send(Hello(os.getpid()))
    return _LINK


def _world_from_env() -> World:
    """The one world of a worker without an agent link: torch's environment variables."""
    rank = int(os.environ.get("RANK", "0"))
    assigned = WorldAssigned(
        generation=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1,
        rank=rank,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        is_fresh=False,
        source_rank=0,
        fresh_ranks=(),
        store={
            "kind": "env",
            "host": os.environ.get("MASTER_ADDR", "127.0.0.1"),
            "port": int(os.environ.get("MASTER_PORT", "29500")),
            "is_master": rank == 0
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true",
        },
        timeout=DEFAULT_TIMEOUT,
    )
    return World(assigned, None)


_TORCH_CLIENTS: dict[tuple[str, int], Any] = {}


def _open_store(spec: dict[str, Any], world: World) -> Any:
    try:
        dist: Any = importlib.import_module("torch.distributed")
    except ImportError:
        raise AgentLinkError(
            "World.store is a torch.distributed.Store: install torch to use it"
        ) from None
    prefix = f"aioelastic/gen{world.generation}"
    kind = spec.get("kind")
    if kind == "file":
        return dist.FileStore(str(spec["path"]), -1)
    if kind == "tcp":
        address = (str(spec["host"]), int(spec["port"]))
        base = _TORCH_CLIENTS.get(address)
        if base is None:  # one connection per process, kept across generations
            base = dist.TCPStore(*address, is_master=False, timeout=world.timeout)
            _TORCH_CLIENTS[address] = base
        return dist.PrefixStore(str(spec.get("prefix", prefix)), base)
    if kind == "env":
        base = dist.TCPStore(
            str(spec["host"]),
            int(spec["port"]),
            world.world_size,
            is_master=bool(spec["is_master"]),
            timeout=world.timeout,
        )
        return dist.PrefixStore(prefix, base)
    raise AgentLinkError(f"the agent described a store this version cannot open: {spec!r}")


_BLOCKING_STORES: dict[tuple[str, int], BlockingTCPStore] = {}
"""This process's connection to each store its worlds were in, kept across generations."""


def _aioelastic_address(spec: dict[str, Any], world: World) -> tuple[str, int, str]:
    """Host, port and key prefix of a world's store for an aioelastic client."""
    kind = spec.get("kind")
    if kind == "tcp":
        return str(spec["host"]), int(spec["port"]), str(spec["prefix"])
    if kind == "env" and not spec["is_master"]:  # the agent's store (TORCHELASTIC_USE_AGENT_STORE)
        return str(spec["host"]), int(spec["port"]), f"aioelastic/gen{world.generation}"
    if kind == "env":
        raise AgentLinkError(
            "without torch, a world's store is the launcher's: run under `aioelastic run` (or "
            "set TORCHELASTIC_USE_AGENT_STORE=True with MASTER_ADDR/MASTER_PORT naming an "
            "aioelastic store); there is no torch here to host a store in rank 0"
        )
    raise AgentLinkError(
        f"the agent described a store that only torch can open: {spec!r}; install torch"
    )


def _open_blocking_store(spec: dict[str, Any], world: World) -> BlockingTCPStore:
    """This generation's view of the process's connection to the world's store (opened now if
    there is none, or the one there is broke)."""
    host, port, prefix = _aioelastic_address(spec, world)
    timeout = world.timeout.total_seconds()
    client = _BLOCKING_STORES.get((host, port))
    if client is None or not client.usable:
        client = BlockingTCPStore(host, port, timeout=timeout, connect_timeout=min(30.0, timeout))
        _BLOCKING_STORES[host, port] = client
    link = world._link
    # A wait ends when the world does: the agent's word on the link makes check() raise.
    interrupt = None if link is None else (link.socket, world.check)
    return client.scoped(prefix, timeout=timeout, interrupt=interrupt)


def _close_blocking_stores() -> None:
    while _BLOCKING_STORES:
        _, client = _BLOCKING_STORES.popitem()
        client.close()


def _has_torch() -> bool:
    """Whether torch.distributed can be imported here (looked up, not imported)."""
    return importlib.util.find_spec("torch") is not None
