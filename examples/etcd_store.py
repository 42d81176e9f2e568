"""A store and a rendezvous kept in etcd: what survives the loss of any one machine.

Run against any etcd v3 (``apt-get install etcd-server``, then ``etcd`` in another shell):
``python examples/etcd_store.py 127.0.0.1:2379``. Needs ``pip install 'aioelastic[etcd]'``.
"""

from __future__ import annotations

import sys
import uuid

import anyio

from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aioelastic.store import EtcdStore


async def main(endpoints: str) -> None:
    job = f"example-{uuid.uuid4().hex[:6]}"
    async with EtcdStore(endpoints, prefix=f"/aioelastic/{job}/") as store:
        await store.set("alive/node-0", b"1", ttl=15)  # an etcd lease: gone 15 s after a crash
        print("arrival:", await store.add("arrivals", 1))  # exactly once, even on failover
        snapshot = await store.get_prefix("alive/")
        print("alive:", sorted(snapshot.items))
        # No atomic add in etcd: count keys as they are written instead (one transaction each,
        # nothing to conflict on); this is how the rendezvous numbers its arrivals on etcd.
        first = await store.multi_set_and_count(["join/a"], [b"a"], prefix="join/")
        second = await store.multi_set_and_count(["join/b"], [b"b"], prefix="join/")
        print(f"joined: {first} then {second}")

    params = RendezvousParameters("etcd", endpoints, job, min_nodes=2, max_nodes=2)
    handlers = [get_rendezvous_handler(params) for _ in range(2)]

    async def join(name: str, index: int) -> None:
        info = await handlers[index].next_rendezvous()
        print(f"{name}: rank {info.rank} of {info.world_size}")

    async with handlers[0], handlers[1], anyio.create_task_group() as tg:
        tg.start_soon(join, "a", 0)
        tg.start_soon(join, "b", 1)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:2379")
