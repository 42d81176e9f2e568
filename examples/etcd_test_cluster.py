"""A 3-member etcd cluster from the test kit, and a store that outlives the loss of its leader.

Needs an ``etcd`` binary (``apt-get install etcd-server``, or ``$AIOELASTIC_ETCD_BINARY``) and
``pip install 'aioelastic[etcd]'``: ``python examples/etcd_test_cluster.py``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from aioelastic.store import EtcdStore
from aioelastic.testing import HOW_TO_GET_ETCD, EtcdCluster, find_etcd_binary


async def count_through_a_leader_loss(cluster: EtcdCluster) -> None:
    async with EtcdStore(cluster.endpoints, prefix="/example/", request_timeout=2) as store:
        print("before:", await store.add("n", 1))
        leader = cluster.leader()
        leader.kill()  # SIGKILL: the others elect a new leader, the store fails over
        print("after the leader's loss:", await store.add("n", 1))
        leader.start()  # the same member back, on its own data


def main() -> None:
    binary = find_etcd_binary()
    if binary is None:
        sys.exit(f"no etcd binary found: {HOW_TO_GET_ETCD}")
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(binary, Path(tmp), size=3) as cluster:
        anyio.run(count_through_a_leader_loss, cluster)


if __name__ == "__main__":
    main()
