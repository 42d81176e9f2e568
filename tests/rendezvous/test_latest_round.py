"""``state/latest`` never moves back, and a node never completes a round it already completed,
even when a publisher stops or dies between sealing a round and advancing ``state/latest``."""

from __future__ import annotations

import anyio
import pytest

from aioelastic.rendezvous import InvalidationReason
from aioelastic.rendezvous import _layout as layout
from aioelastic.testing import RendezvousCluster

pytestmark = pytest.mark.anyio

TIMINGS = {
    "last_call_timeout": 0.5,
    "heartbeat_timeout": 3.0,
    "keep_alive_interval": 0.5,
    "join_timeout": 30.0,
}


async def latest(cluster: RendezvousCluster) -> bytes | None:
    snapshot = await cluster.store.get_prefix(f"rdzv/{cluster.run_id}/{layout.LATEST_KEY}")
    return snapshot.items.get(f"rdzv/{cluster.run_id}/{layout.LATEST_KEY}")


async def test_a_publisher_resumed_after_a_later_round_does_not_move_latest_back() -> None:
    """A sealer stopped before its compare-and-set of round 1 resumes after round 2 was sealed:
    ``state/latest`` stays 2 and the next round is 3 for everyone."""
    async with RendezvousCluster(3, min_nodes=2, max_nodes=8, **TIMINGS) as cluster:
        first, second, late = cluster.nodes
        for node in cluster.nodes:  # arrivals 1, 2, 3: the last two both seal round 1
            await cluster.start_join([node])
            await anyio.wait_all_tasks_blocked()
        stopped = late.store.stall("compare_set")
        await cluster.wait_joined([first, second])
        await stopped.wait_held()
        assert await latest(cluster) == b"1"
        newcomer = await cluster.add_node()  # round 2 forms without the stopped sealer
        await cluster.start_join([newcomer])
        for node in (first, second):
            await node.handler.wait_round_invalidated()
        await cluster.start_join([first, second])
        infos = await cluster.wait_joined([first, second, newcomer])
        assert [info.world_size for info in infos] == [3, 3, 3]
        assert await latest(cluster) == b"2"
        stopped.release()  # it finds round 1 sealed with the value it computed, and itself in it
        await late.wait_joined()
        assert await latest(cluster) == b"2"
        verdict = await late.handler.wait_round_invalidated()
        assert verdict.reason is InvalidationReason.NODES_WAITING
        await cluster.start_join([late])
        for node in (first, second, newcomer):
            await node.handler.wait_round_invalidated()
        await cluster.start_join([first, second, newcomer])
        await cluster.wait_joined()
        assert {node.handler.statistics().round for node in cluster.nodes} == {3}
        assert sorted(node.rank for node in cluster.nodes) == [0, 1, 2, 3]


async def test_members_do_not_rejoin_a_round_whose_publisher_died_before_advancing_latest() -> None:
    """The sealer dies between storing round 1's result and advancing ``state/latest``: a
    survivor's next join is round 2, not round 1 again (which would complete at once)."""
    async with RendezvousCluster(2, min_nodes=2, max_nodes=8, **TIMINGS) as cluster:
        survivor, sealer = cluster.nodes
        await cluster.rendezvous()
        # What the dead sealer leaves behind: round 1 sealed, state/latest not advanced.
        assert await cluster.store.delete_key(f"rdzv/{cluster.run_id}/{layout.LATEST_KEY}")
        await cluster.crash(sealer)
        await cluster.advance(cluster.settings.heartbeat_timeout)
        verdict = await survivor.handler.wait_round_invalidated()
        assert verdict.reason is InvalidationReason.PARTICIPANT_LOST
        newcomer = await cluster.add_node()
        await cluster.rendezvous([survivor, newcomer])
        assert survivor.handler.statistics().round == 2
        assert sorted(node.rank for node in (survivor, newcomer)) == [0, 1]
        assert await latest(cluster) == b"2"
