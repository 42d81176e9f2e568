"""Many rendezvous nodes in one event loop: one MemoryStore, one ManualClock, faults on demand.

Each :class:`Node` is an elastic rendezvous handler (the ``memory`` backend's handler) seeing
the shared store through its own :class:`~aioelastic.testing.FaultyStore`, so one node can be
partitioned, stalled or crashed while the others go on. Each node's handler lives in its own
task (as it would in its own process), so nodes leave in any order. Time moves only when the
test says so: :meth:`RendezvousCluster.advance` steps the clock and lets every task react
after each step, which is how TTLs expire and last calls end, in milliseconds of real time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

from aioelastic.agent import ElasticAgent, RunResult, WorkerSpec
from aioelastic.events import EventStream
from aioelastic.rendezvous import (
    ElasticRendezvousHandler,
    ElasticSettings,
    RendezvousInfo,
    RendezvousParameters,
)
from aioelastic.store import MemoryStore
from aioelastic.testing._clock import ManualClock
from aioelastic.testing._collector import (
    YOUNG_PER_NODE,
    hold_young_generation,
    release_young_generation,
)
from aioelastic.testing._faults import FaultyStore
from aioelastic.testing._settle import wait_all_tasks_blocked

DEFAULT_CONFIG: dict[str, float] = {
    "join_timeout": 600.0,
    "last_call_timeout": 10.0,
    "keep_alive_interval": 5.0,
    "heartbeat_timeout": 15.0,
}
"""Rendezvous timings of a cluster unless overridden (seconds on the cluster's clock)."""


class Node:
    """One simulated node: its handler, its view of the store and its last join's outcome."""

    def __init__(self, name: str, handler: ElasticRendezvousHandler, store: FaultyStore) -> None:
        self.name = name
        self.handler = handler
        self.store = store
        self.info: RendezvousInfo | None = None
        """What the last completed join returned."""
        self.error: Exception | None = None
        """What the last failed join raised."""
        self.exit_error: Exception | None = None
        """What stopped the node's handler while the node was partitioned, if anything."""
        self._joined = anyio.Event()
        self._join_scope: anyio.CancelScope | None = None
        self._leave = anyio.Event()
        self._left = anyio.Event()
        self.agent: ElasticAgent | None = None
        """The agent started on this node by :meth:`RendezvousCluster.start_agents`."""
        self.result: RunResult | None = None
        """What the node's agent returned."""
        self._agent_scope: anyio.CancelScope | None = None
        self._agent_done = anyio.Event()

    def __repr__(self) -> str:
        state = "joining" if self.joining else ("left" if self._left.is_set() else "idle")
        rank = self.info.rank if self.info is not None else None
        return f"Node({self.name!r}, {state}, rank={rank})"

    @property
    def joining(self) -> bool:
        """Whether a join started by :meth:`RendezvousCluster.start_join` is still running."""
        return self._join_scope is not None and not self._joined.is_set()

    @property
    def rank(self) -> int:
        """This node's rank in the round it last completed (raises if it completed none)."""
        if self.info is None:
            raise LookupError(f"{self.name} has not completed a round (error: {self.error!r})")
        return self.info.rank

    async def wait_joined(self) -> RendezvousInfo:
        """Wait for the running join to end; return its info or raise what it raised."""
        await self._joined.wait()
        if self.error is not None:
            raise self.error
        if self.info is None:
            raise LookupError(f"the join of {self.name} was cancelled (the node left)")
        return self.info

    async def _join(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._joined = anyio.Event()
        self.info, self.error = None, None
        with anyio.CancelScope() as scope:
            self._join_scope = scope
            task_status.started()
            try:
                self.info = await self.handler.next_rendezvous()
            except Exception as error:
                self.error = error
            finally:
                self._joined.set()

    async def _run_agent(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        assert self.agent is not None
        with anyio.CancelScope() as scope:
            self._agent_scope = scope
            task_status.started()
            try:
                self.result = await self.agent.run()
            finally:
                self._agent_done.set()

    async def wait_agent(self) -> RunResult:
        """Wait for this node's agent to finish; return its result."""
        await self._agent_done.wait()
        if self.result is None:
            raise LookupError(f"the agent of {self.name} was stopped before it returned")
        return self.result

    async def _host(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the handler entered (in this task) until the node leaves."""
        try:
            async with self.handler:
                task_status.started()
                await self._leave.wait()
                if self._join_scope is not None:
                    self._join_scope.cancel()
                if self._agent_scope is not None:
                    self._agent_scope.cancel()
                    await self._agent_done.wait()  # its workers are stopped before the handler
        except Exception as error:
            if not self.store.partitioned:
                raise
            self.exit_error = error  # a node cut off the store may die; the others go on
        finally:
            self._left.set()


class RendezvousCluster:
    """``size`` elastic rendezvous nodes of run ``run_id`` over one store, in this event loop.

    ```python
    async with RendezvousCluster(3, min_nodes=2) as cluster:
        infos = await cluster.rendezvous()          # every node joins; time moves as needed
        await cluster.crash(cluster.nodes[2])       # no goodbye: its heartbeat must expire
        verdict = await cluster.nodes[0].handler.wait_round_invalidated()
    ```
    ``config`` overrides :data:`DEFAULT_CONFIG` and takes any other rendezvous option.

    Thousands of nodes: while entered, a cluster raises the cyclic garbage collector's young
    generation threshold to 100 allocations a node (``gc.set_threshold``; never lower, and back
    when the last cluster leaves), so that what each node holds across an ``await`` is not
    promoted and walked by full collections: a round, starting and stopping the nodes then cost
    about N times one node's, where the default threshold made 10x the nodes cost 15-19x the
    CPU (``aioelastic/testing/_collector.py``; ``python -m bench.kit``).
    """

    def __init__(
        self,
        size: int,
        *,
        min_nodes: int | None = None,
        max_nodes: int | None = None,
        run_id: str = "test",
        clock: ManualClock | None = None,
        store: MemoryStore | None = None,
        **config: Any,
    ) -> None:
        if size < 0:
            raise ValueError(f"a cluster has at least 0 nodes, not {size}")
        self.clock = clock if clock is not None else ManualClock()
        self.store = store if store is not None else MemoryStore(clock=self.clock)
        self.run_id = run_id
        self.min_nodes = size if min_nodes is None else min_nodes
        self.max_nodes = max(size, self.min_nodes) if max_nodes is None else max_nodes
        self.config: dict[str, Any] = {**DEFAULT_CONFIG, **config}
        self.settings = self._settings()
        self.nodes: list[Node] = []
        self._size = size
        self._names = (f"node{i}" for i in itertools.count())
        self._tg: TaskGroup | None = None
        self._young: int | None = None  # the collector's threshold this cluster holds
        self.events = EventStream(node="cluster")
        """Events of the nodes' rendezvous handlers and agents, by node name."""

    def __repr__(self) -> str:
        return f"RendezvousCluster({len(self.nodes)} nodes, run_id={self.run_id!r}, {self.clock!r})"

    def _settings(self) -> ElasticSettings:
        params = RendezvousParameters(
            "memory", "", self.run_id, self.min_nodes, self.max_nodes, **self.config
        )
        return ElasticSettings.from_parameters(params)

    async def __aenter__(self) -> Self:
        self._tg = await anyio.create_task_group().__aenter__()
        self._fit_collector(self._size)
        try:
            for _ in range(self._size):
                await self.add_node()
        except BaseException as error:
            await self.__aexit__(type(error), error, error.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._tg = self._tg, None
        if tg is None:
            return None
        for node in self.nodes:
            node._leave.set()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            if self._young is not None:
                release_young_generation(self._young)
                self._young = None

    def _fit_collector(self, nodes: int) -> None:
        """Hold the collector's young generation at the size of ``nodes`` nodes (or more)."""
        if self._young is not None and nodes <= self._young // YOUNG_PER_NODE:
            return
        wanted = hold_young_generation(nodes)
        if self._young is not None:
            release_young_generation(self._young)
        self._young = wanted

    def _require_running(self) -> TaskGroup:
        if self._tg is None:
            raise RuntimeError("use the cluster as `async with RendezvousCluster(...) as c:`")
        return self._tg

    # -- membership ------------------------------------------------------------------------

    async def add_node(self) -> Node:
        """Start one more node (it allocates its node id in the store) and return it."""
        tg = self._require_running()
        name = next(self._names)
        store = FaultyStore(self.store, name=name)
        handler = ElasticRendezvousHandler(
            store, self.settings, backend="memory", local_addr="127.0.0.1", clock=self.clock
        )
        node = Node(name, handler, store)
        self.events.attach(handler, "rendezvous", node=name)
        await tg.start(node._host)
        self.nodes.append(node)
        self._fit_collector(len(self.nodes))
        return node

    async def leave(self, node: Node) -> None:
        """Stop ``node`` gracefully: its handler shuts down and tells the round it left."""
        node._leave.set()
        await node._left.wait()

    async def crash(self, node: Node) -> None:
        """Stop ``node`` as a crash would: no goodbye, its liveness key expires on its own.

        Its agent, if one runs, is cancelled (which stops its workers) before the handler goes.
        """
        node.store.partition()
        await self.leave(node)

    def partition(self, node: Node) -> None:
        """Cut ``node`` off the store (its calls fail) until :meth:`heal`."""
        node.store.partition()

    def heal(self, node: Node) -> None:
        """Reconnect ``node`` to the store."""
        node.store.heal()

    async def expire(self, node: Node) -> None:
        """Let ``node``'s liveness TTL run out: partition it, then move past the heartbeat."""
        self.partition(node)
        await self.advance(self.settings.heartbeat_timeout)

    # -- joining ----------------------------------------------------------------------------

    async def start_join(self, nodes: Iterable[Node] | None = None) -> None:
        """Start ``next_rendezvous()`` on ``nodes`` (default: every node) in the background."""
        tg = self._require_running()
        for node in self.nodes if nodes is None else nodes:
            await tg.start(node._join)

    async def wait_joined(self, nodes: Sequence[Node] | None = None) -> list[RendezvousInfo]:
        """Move time until the joins of ``nodes`` end; return their infos in node order.

        Raises the first error a node's join raised. Time moves in ``keep_alive_interval``
        steps, at most until every join timeout has passed.
        """
        chosen = list(self.nodes if nodes is None else nodes)
        step = self.settings.keep_alive_interval
        budget = self.settings.join_timeout + 2 * self.settings.heartbeat_timeout
        await wait_all_tasks_blocked()
        while any(node.joining for node in chosen):
            if budget <= 0:
                stuck = [node.name for node in chosen if node.joining]
                raise TimeoutError(
                    f"{stuck} still joining after the join timeout on {self.clock!r}; "
                    "is a node stalled or partitioned?"
                )
            await self.advance(step)
            budget -= step
        for node in chosen:
            if node.error is not None:
                raise node.error
        return [node.info for node in chosen if node.info is not None]

    async def rendezvous(self, nodes: Sequence[Node] | None = None) -> list[RendezvousInfo]:
        """Join ``nodes`` (default: every node) and return their infos in node order."""
        chosen = list(self.nodes if nodes is None else nodes)
        await self.start_join(chosen)
        return await self.wait_joined(chosen)

    # -- agents -----------------------------------------------------------------------------

    async def start_agents(
        self,
        make_spec: Callable[[Node], WorkerSpec],
        nodes: Iterable[Node] | None = None,
        **agent_options: Any,
    ) -> None:
        """Run an :class:`~aioelastic.agent.ElasticAgent` on ``nodes`` (default: all) in the
        background, with the spec ``make_spec(node)`` gives (its ``rdzv_handler`` is usually
        ``node.handler``); their events go to :attr:`events` under the node's name.
        """
        tg = self._require_running()
        for node in self.nodes if nodes is None else nodes:
            node.agent = ElasticAgent(make_spec(node), **agent_options)
            self.events.attach(node.agent, "agent", node=node.name)
            node._agent_done = anyio.Event()
            await tg.start(node._run_agent)

    async def wait_agents(self, nodes: Sequence[Node] | None = None) -> list[RunResult]:
        """Wait for the agents of ``nodes`` (default: all that have one); return their results.

        Time on the cluster's clock does not move meanwhile: call :meth:`advance` from another
        task when a round needs its last call.
        """
        chosen = [n for n in (self.nodes if nodes is None else nodes) if n.agent is not None]
        return [await node.wait_agent() for node in chosen]

    # -- time -------------------------------------------------------------------------------

    async def advance(self, seconds: float, *, step: float | None = None) -> None:
        """Move the clock by ``seconds`` in steps, letting every task react after each one."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"advance by a finite number of seconds >= 0, not {seconds!r}")
        step = self.settings.keep_alive_interval / 2 if step is None else step
        await wait_all_tasks_blocked()
        while seconds > 1e-9:
            delta = min(step, seconds)
            self.clock.advance(delta)
            seconds -= delta
            await wait_all_tasks_blocked()
