"""A 1,000-node job in one event loop: it forms, loses a node, and the survivors re-form.

Run: ``python examples/rendezvous_scale.py [NODES]``. Every node is a real elastic rendezvous
handler behind its own ``FaultyStore``; time is a ``ManualClock``, so the heartbeat timeout and
the last call pass in no real time. It prints the store work per node, which does not grow
with the job (``python -m bench.scale`` times the same up to 32,000 nodes).
"""

from __future__ import annotations

import sys

import anyio

from aioelastic.testing import RendezvousCluster


def per_node(cluster: RendezvousCluster, calls_before: list[int], nodes: int) -> float:
    calls = [node.store.statistics().calls for node in cluster.nodes]
    return (sum(calls) - sum(calls_before)) / nodes


async def main(size: int) -> None:
    async with RendezvousCluster(size, min_nodes=size - 1, max_nodes=size) as cluster:
        before = [node.store.statistics().calls for node in cluster.nodes]
        infos = await cluster.rendezvous()
        print(f"formed: {len(infos)} nodes, world size {infos[0].world_size}")
        print(f"store calls per node: {per_node(cluster, before, size):.2f}")

        before = [node.store.statistics().calls for node in cluster.nodes]
        await cluster.crash(cluster.nodes[-1])  # no goodbye: its liveness key must expire
        await cluster.advance(cluster.settings.heartbeat_timeout)
        survivors = cluster.nodes[:-1]
        infos = await cluster.rendezvous(survivors)
        print(f"re-formed: {len(infos)} nodes, world size {infos[0].world_size}")
        print(f"store calls per survivor: {per_node(cluster, before, size - 1):.2f}")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
