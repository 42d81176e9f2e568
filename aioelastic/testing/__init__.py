"""The public test kit: a manual clock, many rendezvous nodes in one loop, fault injection,
an event recorder, hosts as network namespaces with real network faults, and real etcd
members on loopback (``EtcdCluster``: needs the ``etcd`` extra and an ``etcd`` binary).

```python
async with RendezvousCluster(3, min_nodes=2) as cluster:
    infos = await cluster.rendezvous()
    await cluster.crash(cluster.nodes[2])
```
"""

from typing import TYPE_CHECKING

from aioelastic.testing._clock import ManualClock
from aioelastic.testing._cluster import DEFAULT_CONFIG, Node, RendezvousCluster
from aioelastic.testing._faults import FaultyStore, FaultyStoreStatistics, Stall
from aioelastic.testing._generations import ProtocolViolation, SimulatedWorker, WorldSimulation
from aioelastic.testing._netns import (
    FaultUnsupportedError,
    Host,
    Network,
    NetworkUnavailableError,
    unavailable_reason,
)
from aioelastic.testing._recorder import EventRecorder

if TYPE_CHECKING:
    from aioelastic.testing._etcd import HOW_TO_GET_ETCD, EtcdCluster, EtcdMember, find_etcd_binary

_ETCD_NAMES = frozenset({"HOW_TO_GET_ETCD", "EtcdCluster", "EtcdMember", "find_etcd_binary"})


def __getattr__(name: str) -> object:
    if name in _ETCD_NAMES:  # imported on first use: they need the etcd extra (grpc)
        from aioelastic.testing import _etcd

        return getattr(_etcd, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_CONFIG",
    "HOW_TO_GET_ETCD",
    "EtcdCluster",
    "EtcdMember",
    "EventRecorder",
    "FaultUnsupportedError",
    "FaultyStore",
    "FaultyStoreStatistics",
    "Host",
    "ManualClock",
    "Network",
    "NetworkUnavailableError",
    "Node",
    "ProtocolViolation",
    "RendezvousCluster",
    "SimulatedWorker",
    "Stall",
    "WorldSimulation",
    "find_etcd_binary",
    "unavailable_reason",
]
