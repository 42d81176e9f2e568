"""``num_nodes_waiting()`` on a member counts the nodes joined to the round after its own, even
while ``state/latest`` lags that round (issue 30, item 4).

The race: a round's sealer stores the result, then advances ``state/latest`` in a second step;
the other members complete as soon as they read the result. ``num_nodes_waiting()`` read the
round after ``state/latest``: in that window (for good, if the sealer died in between) it
counted the members' own join records as waiting (2 where nobody waited, 3 where one node did).
The members' inbox watch, which reads the round after their own, was right all along.
"""

from __future__ import annotations

import pytest

from aioelastic.rendezvous import InvalidationReason
from aioelastic.rendezvous import _layout as layout
from aioelastic.testing import RendezvousCluster

pytestmark = pytest.mark.anyio

TIMINGS = {"last_call_timeout": 1.0, "heartbeat_timeout": 3.0, "keep_alive_interval": 0.5}


async def test_a_late_joiner_is_counted_while_state_latest_lags_the_round() -> None:
    """c10d-like run, min 2, max 3, last call 1 s: the round of two completes but
    ``state/latest`` was not advanced yet; nobody waits (0), then a third node joins and both
    members count exactly it (1)."""
    async with RendezvousCluster(2, min_nodes=2, max_nodes=3, **TIMINGS) as cluster:
        members = list(cluster.nodes)
        await cluster.rendezvous()
        # The window between the result and the sealer's advance of state/latest, held open.
        assert await cluster.store.delete_key(f"rdzv/{cluster.run_id}/{layout.LATEST_KEY}")
        assert [await node.handler.num_nodes_waiting() for node in members] == [0, 0]
        late = await cluster.add_node()
        await cluster.start_join([late])
        for node in members:
            verdict = await node.handler.wait_round_invalidated()
            assert verdict.reason is InvalidationReason.NODES_WAITING
        assert [await node.handler.num_nodes_waiting() for node in members] == [1, 1]
        assert [await node.handler.waiting_nodes() for node in members] == [
            {late.handler.node_id: "127.0.0.1"}
        ] * 2
