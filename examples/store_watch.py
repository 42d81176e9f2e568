"""Liveness without clocks: heartbeat keys with a TTL, and a watcher woken by every change.

Run: ``python examples/store_watch.py``
"""

from __future__ import annotations

import anyio

from aioelastic.store import MemoryStore, PrefixStore


async def main() -> None:
    store = PrefixStore("job-42", MemoryStore())
    await store.set("nodes/a", b"alive", ttl=0.2)  # expires unless written again
    await store.set("nodes/b", b"alive")  # permanent
    snapshot = await store.get_prefix("nodes/")
    print("nodes:", sorted(snapshot.items))
    # Wait from the revision we read: a change between the read and the wait is never missed.
    revision = await store.wait_for_change("nodes/", after=snapshot.revision, timeout=5)
    print("after the change:", sorted((await store.get_prefix("nodes/")).items))
    print(f"revision {snapshot.revision} -> {revision}: node 'a' missed its heartbeat")


if __name__ == "__main__":
    anyio.run(main)
