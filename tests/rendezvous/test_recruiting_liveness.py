"""A round whose joiners' heartbeats lapsed (SIGSTOP) and came back still completes."""

from __future__ import annotations

import anyio
import pytest

from aioelastic.testing import RendezvousCluster

pytestmark = pytest.mark.anyio

TIMINGS = {"last_call_timeout": 0.5, "heartbeat_timeout": 3.0, "keep_alive_interval": 0.5}


async def test_sealer_stopped_past_its_heartbeat_still_seals_after_resuming() -> None:
    """A sealer that read the joins while its own liveness key had lapsed seals once it is back."""
    async with RendezvousCluster(2, min_nodes=2, max_nodes=8, **TIMINGS) as cluster:
        first, sealer = cluster.nodes
        await cluster.start_join([first])
        await anyio.wait_all_tasks_blocked()
        await cluster.start_join([sealer])
        await anyio.wait_all_tasks_blocked()
        reads, writes = sealer.store.stall("get_prefix"), sealer.store.stall("set")
        await cluster.advance(4.0)  # "stopped": the sealer's heartbeat expires meanwhile
        reads.release()  # it reads the joins before its keep-alive runs again
        await anyio.wait_all_tasks_blocked()
        writes.release()
        await cluster.advance(10.0)
        assert not any(node.joining for node in cluster.nodes)
        infos = await cluster.wait_joined()
        assert sorted(info.rank for info in infos) == [0, 1]


async def test_member_stopped_past_its_heartbeat_is_sealed_once_resumed() -> None:
    """A joiner whose heartbeat lapsed while stopped is sealed into the round once it is back."""
    async with RendezvousCluster(2, min_nodes=2, max_nodes=8, **TIMINGS) as cluster:
        first, sealer = cluster.nodes
        await cluster.start_join([first])
        await anyio.wait_all_tasks_blocked()
        writes = first.store.stall("set")  # "stopped": its keep-alive makes no progress
        await cluster.advance(4.0)  # its heartbeat expires before the sealer arrives
        await cluster.start_join([sealer])
        await cluster.advance(1.0)  # the sealer's last call finds one live joiner
        writes.release()
        await cluster.advance(10.0)
        assert not any(node.joining for node in cluster.nodes)
        infos = await cluster.wait_joined()
        assert sorted(info.rank for info in infos) == [0, 1]
