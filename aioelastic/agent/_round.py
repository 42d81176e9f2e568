"""A node's part in a rendezvous round, beside its workers: the slot exchange that numbers the
workers across nodes, waiting for the round to end, and the exit barrier.

Each is one coroutine over the round's store and the rendezvous handler; the agent
(``_agent.py``) decides what an ending means.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio

from aioelastic._concurrency import first_of
from aioelastic.agent._env import NodeSlot, RoundInfo, WorkerRanks, assign_ranks
from aioelastic.agent._events import AgentEvent, MembershipChanged, NodeFenced
from aioelastic.agent._generation_log import INPLACE_RECORD_PREFIX, NodeRecord
from aioelastic.agent._group import Outcome
from aioelastic.agent._spec import WorkerSpec
from aioelastic.rendezvous import (
    InvalidationReason,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
)
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.store import StoreError

logger = logging.getLogger(__name__)

STORE_PREFIX = "aioelastic/agent/"
"""Where the agents of a round keep their slots and the exit barrier, in the round's store."""

Emit = Callable[[AgentEvent], None]


async def exchange_slots(
    info: RendezvousInfo, slot: NodeSlot, record: NodeRecord | None
) -> tuple[list[NodeSlot], list[NodeRecord]]:
    """Every node's slot, by node rank, and (in-place recovery across nodes) every node's
    record of the generation it runs: one store round trip per node."""
    if info.world_size == 1:
        return [slot], [] if record is None else [record]
    keys = [f"{STORE_PREFIX}slot/{rank}" for rank in range(info.world_size)]
    await info.store.set(keys[info.rank], slot.encode())
    records = []
    if record is not None:
        held = [f"{INPLACE_RECORD_PREFIX}{rank}" for rank in range(info.world_size)]
        await info.store.set(held[info.rank], record.encode())
        records = [NodeRecord.decode(raw) for raw in await info.store.multi_get(held)]
    return [NodeSlot.decode(raw) for raw in await info.store.multi_get(keys)], records


async def number_workers(
    info: RendezvousInfo,
    spec: WorkerSpec,
    record: NodeRecord | None,
    *,
    run_id: str,
    restart_count: int,
) -> tuple[RoundInfo, list[WorkerRanks], list[NodeRecord]]:
    """This node's workers numbered across the job, the round as they are told it, and
    (given this node's ``record``) every node's record."""
    slot = NodeSlot(spec.role, spec.local_world_size)
    nodes, records = await exchange_slots(info, slot, record)
    bootstrap = info.bootstrap_store_info
    round_info = RoundInfo(
        run_id=run_id,
        group_rank=info.rank,
        group_world_size=info.world_size,
        master_addr=bootstrap.master_addr,
        master_port=bootstrap.master_port,
        restart_count=restart_count,
        use_agent_store=spec.rdzv_handler.use_agent_store,
        round=info.round,
    )
    return round_info, assign_ranks(nodes, info.rank), records


async def round_ended(handler: RendezvousHandler, emit: Emit) -> tuple[Outcome, str]:
    """Wait until the round ends under this node, and say how: closed, fenced, or a
    membership change."""
    event = await handler.wait_round_invalidated()
    if event.reason is InvalidationReason.CLOSED:
        return Outcome.CLOSED, f"the rendezvous was closed: {event.detail}"
    if event.reason is InvalidationReason.STORE_LOST:  # the job cannot go on: it ends
        return Outcome.CLOSED, event.detail
    if event.reason is InvalidationReason.FENCED:
        emit(NodeFenced(event.detail))
        return Outcome.FENCED, event.detail
    emit(MembershipChanged(event.reason.name, event.detail))
    return Outcome.MEMBERSHIP, event.detail


async def lapsed_while_joining(
    handler: RendezvousHandler, emit: Emit
) -> RendezvousInfo | tuple[Outcome, str]:
    """Fenced while re-rendezvousing with the workers running: no liveness renewal was
    acknowledged in time (cut off, say), so the others may already have taken this node
    for dead and its workers' ranks: they stop as in a fenced round."""
    if not isinstance(handler, ElasticRendezvousHandler):  # no lease of its own to watch
        await anyio.sleep_forever()
    assert isinstance(handler, ElasticRendezvousHandler)
    why = await handler.wait_lease_lapsed()
    detail = f"fenced while re-rendezvousing with workers running: {why}"
    emit(NodeFenced(detail))
    return Outcome.FENCED, detail


def joining(
    join: Callable[[], Awaitable[RendezvousInfo]],
) -> Callable[[], Awaitable[RendezvousInfo | tuple[Outcome, str]]]:
    """``join`` typed as one side of a race with an outcome."""

    async def joined() -> RendezvousInfo | tuple[Outcome, str]:
        return await join()

    return joined


async def exit_barrier(
    handler: RendezvousHandler, info: RendezvousInfo, *, timeout: float, run_id: str
) -> None:
    """Wait (at most ``timeout``) until every node's workers succeeded; the last to finish
    closes the job.

    The last node closes the rendezvous *before* announcing the end, and nobody touches
    the store after the announcement: the node hosting the store may leave at once.
    """
    if info.world_size == 1:
        await handler.set_closed()
        return
    done = f"{STORE_PREFIX}exit/done"

    async def everyone_done() -> None:
        if await info.store.add(f"{STORE_PREFIX}exit/count", 1) >= info.world_size:
            await handler.set_closed()
            await info.store.set(done, b"1")
        else:
            await info.store.wait([done], timeout=math.inf)

    async def round_broken() -> None:
        await handler.wait_round_invalidated()  # a node left: stop waiting for it

    with anyio.move_on_after(timeout):
        try:
            await first_of(everyone_done, round_broken)
        except (StoreError, RendezvousError) as exc:  # our workers succeeded regardless
            logger.warning("exit barrier of run %r cut short: %s", run_id, exc)
