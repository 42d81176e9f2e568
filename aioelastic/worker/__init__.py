"""The worker's side of in-place recovery: one :class:`World` per generation of the job's world.

```python
from aioelastic import worker

for world in worker.worlds():          # blocks until this process has a place
    with world:                         # the world ending ends the world, not the process
        world.init_process_group("gloo")
        step = worker.hand_over(world, model, optimizer, step=step).step  # to fresh ranks
        train(world)                    # world.check() at a step boundary,
                                        # world.should_stop(step): save and return
```
Under ``aioelastic run --recovery in-place`` a failed worker is replaced and the survivors go
on in the next world; anywhere else :func:`worlds` yields one world from torch's environment.
``world.should_stop(step)`` is True on every rank at the same step once any node of the job is
preempted (under ``aioelastic run``; see ``_preemption.py``).
"""

from aioelastic.worker._handover import HandedOver, HandOverError, hand_over
from aioelastic.worker._link import AgentLinkError
from aioelastic.worker._protocol import LinkProtocolError
from aioelastic.worker._world import World, WorldChanged, async_worlds, worlds

__all__ = [
    "AgentLinkError",
    "HandOverError",
    "HandedOver",
    "LinkProtocolError",
    "World",
    "WorldChanged",
    "async_worlds",
    "hand_over",
    "worlds",
]
