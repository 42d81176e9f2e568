"""The public test kit: a manual clock, many rendezvous nodes in one loop, fault injection,
an event recorder, and hosts as network namespaces with real network faults.

```python
async with RendezvousCluster(3, min_nodes=2) as cluster:
    infos = await cluster.rendezvous()
    await cluster.crash(cluster.nodes[2])
```
"""

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

__all__ = [
    "DEFAULT_CONFIG",
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
    "unavailable_reason",
]
