"""Which worker group each attempt runs: in-place recovery where asked for and possible.

On one node, or across nodes with an elastic rendezvous (c10d, etcd), ``--recovery in-place``
gets an :class:`~aioelastic.agent._recovery.InPlaceGroup`; anything else the plain group. The
attempts of one agent share what outlives a group: the generation numbers (they go on) and the
modules its spares learned to import.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from aioelastic.agent._env import RoundInfo, WorkerRanks
from aioelastic.agent._generation_log import NodeRecord
from aioelastic.agent._generation_types import NodeSpec
from aioelastic.agent._group import Outcome, WorkerGroup
from aioelastic.agent._recovery import InPlaceGroup
from aioelastic.agent._spec import WorkerSpec
from aioelastic.rendezvous import RendezvousInfo
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.store import PrefixStore, Store

logger = logging.getLogger("aioelastic.agent._recovery")


def job_store(info: RendezvousInfo) -> Store | None:
    """The run's store under a round's (``store/<round>`` of the elastic handlers), where the
    generation log outlives rounds; None for a backend that has no such layout."""
    store = info.store
    if isinstance(store, PrefixStore) and store.prefix == f"store/{info.round}":
        return store.store
    return None


class Attempts:
    """Makes each attempt's worker group: in-place recovery where asked for and possible.

    Generation numbers go on from one attempt to the next, so they strictly increase within
    the job even across a fallback to a restart.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.store: Store | None = None
        """The round's store: each in-place group shows its generation there."""
        self.last_generation = 0
        self.warm_modules: list[str] = []
        """What this node's workers had loaded by their first step (see
        :attr:`InPlaceGroup.warm_modules`): learned in one attempt, kept for the next."""
        self.epochs_run: set[int] = set()
        """The in-place epochs across nodes this agent's groups began or joined: a node an
        epoch began with that never ran it (the round ended under it in its slot exchange)
        joins it without calling an earlier life lost."""
        self._current: InPlaceGroup | None = None
        self._warned = False
        self._heard: tuple[RendezvousInfo, tuple[NodeRecord, ...]] | None = None

    @property
    def node_id(self) -> int | None:
        """This node's id when its job recovers in place across nodes (an elastic rendezvous
        that allows more than one node), else None."""
        handler = self.spec.rdzv_handler
        if self.spec.recovery != "in-place" or not isinstance(handler, ElasticRendezvousHandler):
            return None
        return handler.node_id if handler.settings.max_nodes > 1 else None

    def record(self) -> NodeRecord | None:
        """What this node says of itself in the round being assigned (None: not across nodes)."""
        node = self.node_id
        if node is None:
            return None
        current = self._current
        epoch, last = 0, self.last_generation
        if current is not None and current.shared and current.live:
            epoch = current.epoch
            last = max(last, current.replica.last_generation)
        spec = NodeSpec(self.spec.local_world_size, self.spec.spares)
        return NodeRecord(node, spec, epoch, last)

    def heard(self, info: RendezvousInfo, records: Sequence[NodeRecord]) -> None:
        """Every node's record of round ``info`` (the agent exchanges them with the slots)."""
        self._heard = (info, tuple(records))

    def new_round(self) -> tuple[Outcome, str] | None:
        """Tell the running shared group of the round just heard; an outcome if it must end."""
        current = self._current
        assert current is not None
        assert current.shared
        assert self._heard is not None
        info, records = self._heard
        current.show_in(info.store, info.rank)
        return current.new_round(records, info.round)

    def group(self, info: RoundInfo, ranks: list[WorkerRanks], **options: Any) -> WorkerGroup:
        """The group of the attempt ``info`` (``options`` as :class:`WorkerGroup` takes them)."""
        self._note_last()
        if self.spec.recovery != "in-place":
            return WorkerGroup(self.spec, info, ranks, **options)
        node, heard = self.node_id, self._heard
        job = None if heard is None else job_store(heard[0])
        if node is not None and heard is not None and job is not None:
            shared = InPlaceGroup(
                self.spec,
                info,
                ranks,
                job=job,
                node=node,
                records=heard[1],
                round_=heard[0].round,
                **options,
            )
            shared.store = self.store
            shared.warm_modules = self.warm_modules
            shared.epochs_run = self.epochs_run
            self._current = shared
            return shared
        if info.group_world_size > 1:
            if not self._warned:
                logger.warning(
                    "--recovery in-place recovers a job over %d nodes only with an elastic "
                    "rendezvous (c10d, etcd); here a failure restarts the group as --recovery "
                    "restart does",
                    info.group_world_size,
                )
                self._warned = True
            return WorkerGroup(self.spec, info, ranks, **options)
        group = InPlaceGroup(self.spec, info, ranks, **options)
        group.first_generation = self.last_generation + 1
        group.store = self.store
        group.warm_modules = self.warm_modules
        self._current = group
        return group

    def _note_last(self) -> None:
        current, self._current = self._current, None
        if current is not None and current.replica.last_generation:
            self.last_generation = current.replica.last_generation
