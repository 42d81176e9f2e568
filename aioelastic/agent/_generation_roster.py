"""Who runs where: the worker processes of a job's world, their slots and their states.

The :class:`Roster` is the generation machine's bookkeeping of processes (started, asking for a
world, holding a place, gone) and of nodes (what each contributes, the next serial number of a
worker there). It knows nothing of generations: which worker holds which rank is the machine's
business (``_generation_machine.py``), helped by two pure choices made over workers here:
:func:`dense_ranks` and :func:`suspects`. Pure, like the machine.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from aioelastic.agent._generation_types import Generation, NodeSpec, WorkerKey


class WorkerState(enum.Enum):
    STARTING = "started, not yet asking for a world"
    READY = "asking for a world"
    MEMBER = "holds a place in the current generation"
    DONE = "exited 0"
    GONE = "failed, lost or stopped"


ENDED = (WorkerState.DONE, WorkerState.GONE)
"""States of a worker whose process no longer runs (as far as the machine knows)."""


@dataclass(slots=True)
class RosterWorker:
    key: WorkerKey
    slot: int | None
    """The local rank it was started for; None for a spare (until it takes a slot)."""
    state: WorkerState = WorkerState.STARTING
    joiner: bool = False
    """Started for a node that joined; waits for the next generation."""
    entered: int = 0
    """The newest generation it entered (0: none)."""


@dataclass(slots=True)
class RosterNode:
    spec: NodeSpec
    serial: int = 0
    in_world: bool = True
    """Whether its slots are part of the world (a joining node's are once its workers asked)."""


class Roster:
    """The job's nodes and every worker process started on them (see the module docstring)."""

    def __init__(self, nodes: Mapping[int, NodeSpec]) -> None:
        self.nodes = {node: RosterNode(spec) for node, spec in sorted(nodes.items())}
        self.workers: dict[WorkerKey, RosterWorker] = {}

    def __getitem__(self, key: WorkerKey) -> RosterWorker:
        return self.workers[key]

    def get(self, key: WorkerKey) -> RosterWorker | None:
        return self.workers.get(key)

    def __iter__(self) -> Iterator[RosterWorker]:
        return iter(self.workers.values())

    # -- nodes ------------------------------------------------------------------------------------

    def add_node(self, node: int, spec: NodeSpec, *, in_world: bool) -> RosterNode:
        """A node joins; a node that joins again never reuses the keys of its earlier workers."""
        serial = 1 + max((k.serial for k in self.workers if k.node == node), default=-1)
        state = RosterNode(spec, serial=serial, in_world=in_world)
        self.nodes[node] = state
        self.nodes = dict(sorted(self.nodes.items()))
        return state

    def remove_node(self, node: int) -> RosterNode | None:
        """A node is gone: its workers that still ran are gone with it."""
        state = self.nodes.pop(node, None)
        if state is not None:
            for worker in self.workers.values():
                if worker.key.node == node and worker.state not in ENDED:
                    worker.state = WorkerState.GONE
        return state

    # -- workers ----------------------------------------------------------------------------------

    def new_worker(self, node: int, slot: int | None, *, joiner: bool = False) -> RosterWorker:
        """A worker to start on ``node`` for ``slot`` (None: a spare), with a fresh key."""
        state = self.nodes[node]
        key = WorkerKey(node, state.serial)
        state.serial += 1
        worker = RosterWorker(key, slot, joiner=joiner)
        self.workers[key] = worker
        return worker

    def node_workers(self, node: int, *, joiner: bool) -> list[RosterWorker]:
        """The workers to start for ``node``: one per slot, in slot order, then its spares."""
        state = self.nodes[node]
        made = [self.new_worker(node, s, joiner=joiner) for s in range(state.spec.local_world_size)]
        return made + [self.new_worker(node, None) for _ in range(state.spec.spares)]

    def unstarted(self, node: int, spec: NodeSpec) -> list[RosterWorker] | None:
        """``node``'s workers if it joins with the spec it had and none of them was ever heard
        from (its agent may never have started them); else None."""
        state = self.nodes.get(node)
        workers = [w for w in self.workers.values() if w.key.node == node]
        if state is None or state.spec != spec:
            return None
        return workers if all(w.state is WorkerState.STARTING for w in workers) else None

    def spares(self, node: int | None = None) -> tuple[WorkerKey, ...]:
        """Ready spares (on ``node``, or anywhere), oldest first."""
        return tuple(
            w.key
            for w in self.workers.values()
            if w.slot is None
            and w.state is WorkerState.READY
            and (node is None or w.key.node == node)
        )

    def spare_for(self, node: int) -> WorkerKey | None:
        """The spare to take a slot on ``node``: a ready one, else one still starting (it is
        further along than a process started now)."""
        starting = (
            w.key
            for w in self.workers.values()
            if w.key.node == node and w.slot is None and w.state is WorkerState.STARTING
        )
        return next(iter(self.spares(node)), None) or next(starting, None)

    def spares_missing(self, node: int) -> int:
        """How many spares ``node`` lacks (ready or starting ones count)."""
        state = self.nodes.get(node)
        if state is None:
            return 0
        have = sum(
            1
            for w in self.workers.values()
            if w.key.node == node
            and w.slot is None
            and w.state in (WorkerState.STARTING, WorkerState.READY)
        )
        return state.spec.spares - have

    def alive(self) -> tuple[WorkerKey, ...]:
        """Every worker that still runs, as far as the machine knows."""
        return tuple(k for k, w in self.workers.items() if w.state not in ENDED)

    def joiners_ready(self, node: int) -> bool:
        """Whether every slot's worker of joining ``node`` asked for a world."""
        joiners = [
            w
            for w in self.workers.values()
            if w.key.node == node and w.joiner and w.slot is not None
        ]
        return bool(joiners) and all(w.state is WorkerState.READY for w in joiners)


def dense_ranks(
    holders: Mapping[tuple[int, int], RosterWorker], previous: Generation | None
) -> list[RosterWorker]:
    """The members of a new generation in rank order, given who holds each ``(node, slot)``:
    ranks are dense, a survivor keeps its rank below the new size, the rest fill in order."""
    ordered = [holders[slot] for slot in sorted(holders)]
    size = len(ordered)
    old_rank = {} if previous is None else {k: r for r, k in enumerate(previous.members)}
    ranks: list[RosterWorker | None] = [None] * size
    rest = []
    for worker in ordered:
        rank = old_rank.get(worker.key)
        if rank is not None and rank < size and ranks[rank] is None:
            ranks[rank] = worker
        else:
            rest.append(worker)
    free = iter(rest)
    return [slot if slot is not None else next(free) for slot in ranks]


def suspects(
    members: Sequence[WorkerKey], troubled: Collection[WorkerKey]
) -> tuple[WorkerKey, ...]:
    """Members to evict: when most of a generation's members saw their collectives fail while
    no member died, the silent ones are the likely hung peers (on gloo nothing else gets the
    others out). A minority in trouble is taken for its own bug: nobody is evicted."""
    silent = tuple(key for key in members if key not in troubled)
    return silent if silent and 2 * len(troubled) > len(members) else ()
