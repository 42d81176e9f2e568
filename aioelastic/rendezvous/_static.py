"""The ``static`` backend: a fixed world size, ranks given in the config.

Rank 0 hosts the TCP store at the endpoint, the others connect (``token_file`` secures it, as
for ``c10d``). Each node claims its rank,
rank 0 publishes where the workers' own store will live (its address and a free port), and
everyone waits until every rank has arrived, at most ``join_timeout`` (``timeout``) seconds.

A later ``next_rendezvous()`` starts the job's next attempt (a restart) with every node, as a new
round of an elastic backend would: the node announces it (which ends the others' round through
:meth:`~StaticRendezvousHandler.wait_round_invalidated`), says its workers stopped, and waits
until every node has; rank 0 then deletes the keys the last attempt's workers wrote at the
store's root (torch's clients share it when workers get exactly the master address, as under
torchrun) before anyone starts a worker. Without this, a node that restarted first started a
worker that read a stale address of a peer's old worker and failed the job's one restart. Each
attempt is a round: its own keyspace (``RendezvousInfo.store``) and number (``round``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Self

import anyio

from aioelastic.rendezvous._c10d import open_tcp_store, parse_endpoint
from aioelastic.rendezvous._elastic import free_port, local_hostname
from aioelastic.rendezvous._errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousParameterError,
    RendezvousStateError,
    RendezvousTimeoutError,
    RendezvousUsageError,
)
from aioelastic.rendezvous._handler import RendezvousHandler
from aioelastic.rendezvous._info import (
    InvalidationReason,
    RendezvousInfo,
    RendezvousStoreInfo,
    RoundInvalidated,
    StaticRendezvousStatistics,
)
from aioelastic.rendezvous._parameters import RendezvousParameters, seconds
from aioelastic.rendezvous._security import SECURITY_KEYS, store_credentials
from aioelastic.store import PrefixStore, Store, StoreError, StoreTimeoutError

ROOT_PREFIX = "rdzv/"
"""Where every rendezvous key lives in the job's store; torch's keys are the rest."""

STATIC_KEYS = frozenset(
    {"rank", "join_timeout", "timeout", "read_timeout", "local_addr", *SECURITY_KEYS}
)


class StaticRendezvousHandler(RendezvousHandler):
    """A fixed-size job: ``min_nodes == max_nodes`` nodes with configured ranks."""

    def __init__(self, params: RendezvousParameters) -> None:
        params.check_keys(STATIC_KEYS)
        if params.min_nodes != params.max_nodes:
            raise RendezvousParameterError(
                f"the static backend needs a fixed size, but min_nodes={params.min_nodes} and "
                f"max_nodes={params.max_nodes}; use c10d for elastic jobs"
            )
        rank = params.get_as_int("rank")
        if rank is None or not 0 <= rank < params.max_nodes:
            raise RendezvousParameterError(
                f"the static backend needs rank=0..{params.max_nodes - 1} in its config "
                f"(torchrun: --node-rank), not {rank!r}"
            )
        join = seconds(params, "join_timeout", seconds(params, "timeout", 600.0))
        read = seconds(params, "read_timeout", 60.0)
        self.run_id = params.run_id
        self.rank = rank
        self.world_size = params.max_nodes
        self.join_timeout = join
        self._host, self._port = parse_endpoint(params.endpoint)
        self._read_timeout = read
        self._addr = params.local_addr or params.get("local_addr")
        self._credentials = store_credentials(params)
        self._stack: AsyncExitStack | None = None
        self._root: Store | None = None
        self._store: Store | None = None
        self._attempt = 0
        self._info: RendezvousInfo | None = None
        self._joining = False
        self._invalidated: RoundInvalidated | None = None

    def statistics(self) -> StaticRendezvousStatistics:
        """Return a snapshot of this handler's state."""
        return StaticRendezvousStatistics(
            rank=self.rank,
            world_size=self.world_size,
            joining=self._joining,
            rounds_completed=int(self._info is not None),
            invalidated=self._invalidated,
        )

    @property
    def endpoint(self) -> tuple[str, int]:
        """The host and port of the job's store (rank 0 serves it)."""
        return self._host, self._port

    @property
    def secured(self) -> bool:
        """Whether the job's store asks clients for a token or TLS (torch's clients have none)."""
        return self._credentials.token is not None or self._credentials.server_tls is not None

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return self.run_id

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            client = await stack.enter_async_context(
                open_tcp_store(
                    self._host,
                    self._port,
                    is_host=self.rank == 0,
                    read_timeout=self._read_timeout,
                    connect_timeout=self.join_timeout,
                    credentials=self._credentials,
                )
            )
        except BaseException:
            await stack.aclose()
            raise
        self._root = client
        self._store = PrefixStore(f"{ROOT_PREFIX}{self.run_id}/static", client)
        self._stack = stack
        return self

    def _require_store(self) -> Store:
        if self._store is None:
            raise RendezvousUsageError("use the handler as `async with handler:` before calling it")
        return self._store

    async def next_rendezvous(self) -> RendezvousInfo:
        """Claim this rank and wait for all ranks; a later call starts the next attempt with
        every node (see the module docstring)."""
        store = self._require_store()
        if await self.is_closed():
            raise RendezvousClosedError(self.run_id)
        self._joining = True
        try:
            if self._info is None:
                return await self._join(store)
            return await self._restart(store, self._info)
        finally:
            self._joining = False

    async def _restart(self, store: Store, last: RendezvousInfo) -> RendezvousInfo:
        attempt = self._attempt + 1
        key = f"attempt/{attempt}"
        try:
            await store.set(f"{key}/begun", b"1")
            await store.set(f"{key}/stopped/{self.rank}", b"1")
            stopped = [f"{key}/stopped/{rank}" for rank in range(self.world_size)]
            try:
                await store.multi_get(stopped, timeout=self.join_timeout)
            except StoreTimeoutError:
                arrived = len((await store.get_prefix(f"{key}/stopped/")).items)
                raise RendezvousTimeoutError(
                    self.run_id, self.join_timeout, arrived, self.world_size
                ) from None
            if self.rank == 0:
                await self._clear_torch_keys()
                await store.set(f"{key}/clean", b"1")
            await store.get(f"{key}/clean", timeout=self.join_timeout)
        except StoreTimeoutError:  # rank 0 stopped answering between the two waits
            raise RendezvousTimeoutError(
                self.run_id, self.join_timeout, self.world_size - 1, self.world_size
            ) from None
        except StoreError as error:
            raise RendezvousConnectionError(f"static rendezvous lost its store: {error}") from error
        self._attempt = attempt
        self._invalidated = None
        self._info = dataclasses.replace(
            last, store=PrefixStore(f"store/attempt_{attempt}", store), round=attempt
        )
        return self._info

    async def _clear_torch_keys(self) -> None:
        """Delete what torch's clients wrote at the store's root (every key but ours)."""
        assert self._root is not None
        for name in (await self._root.get_prefix("")).items:
            if not name.startswith(ROOT_PREFIX):
                await self._root.delete_key(name)

    async def _join(self, store: Store) -> RendezvousInfo:
        try:
            if self.rank == 0:
                addr = self._addr or await anyio.to_thread.run_sync(local_hostname)
                await store.set("master", json.dumps([addr, free_port(addr)]))
            claim = secrets.token_hex(8)
            owner = await store.compare_set(f"rank/{self.rank}", "", claim)
            if owner.decode() != claim:
                raise RendezvousStateError(
                    f"rank {self.rank} of run {self.run_id!r} is already taken by another node; "
                    "give every node a distinct rank (torchrun: --node-rank)"
                )
            keys = ["master", *(f"rank/{r}" for r in range(self.world_size))]
            try:
                values = await store.multi_get(keys, timeout=self.join_timeout)
            except StoreTimeoutError:
                arrived = len((await store.get_prefix("rank/")).items)
                raise RendezvousTimeoutError(
                    self.run_id, self.join_timeout, arrived, self.world_size
                ) from None
        except StoreError as error:
            raise RendezvousConnectionError(f"static rendezvous lost its store: {error}") from error
        addr, port = json.loads(values[0])
        self._info = RendezvousInfo(
            PrefixStore("store", store),
            self.rank,
            self.world_size,
            RendezvousStoreInfo(str(addr), int(port)),
        )
        return self._info

    async def is_closed(self) -> bool:
        return await self._require_store().check(["closed"])

    async def set_closed(self) -> None:
        await self._require_store().set("closed", b"1")

    async def num_nodes_waiting(self) -> int:
        """Always 0: a static job admits no new nodes."""
        return 0

    async def wait_round_invalidated(self) -> RoundInvalidated:
        """Return when the job is closed or another node starts the next attempt."""
        store = self._require_store()
        if self._info is None:
            raise RendezvousUsageError(
                "no round completed on this handler yet; call next_rendezvous() first"
            )
        restart = f"attempt/{self._attempt + 1}/begun"
        closed = await first_key(store, ["closed", restart]) == "closed"
        if self._invalidated is None:
            self._invalidated = (
                RoundInvalidated(InvalidationReason.CLOSED, f"run {self.run_id!r} was closed")
                if closed
                else RoundInvalidated(
                    InvalidationReason.RESTARTING,
                    f"another node restarts run {self.run_id!r}: every node starts attempt "
                    f"{self._attempt + 1} together",
                )
            )
        return self._invalidated

    async def shutdown(self) -> bool:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        return True


async def first_key(store: Store, keys: Sequence[str]) -> str:
    """Wait until one of ``keys`` exists; return it."""
    found: list[str] = []
    async with anyio.create_task_group() as tg:

        async def wait(key: str) -> None:
            await store.wait([key], timeout=math.inf)
            found.append(key)
            tg.cancel_scope.cancel()

        for key in keys:
            tg.start_soon(wait, key)
    return found[0]


def create_handler(params: RendezvousParameters) -> StaticRendezvousHandler:
    """Create a ``static`` handler (see the module docstring)."""
    return StaticRendezvousHandler(params)
