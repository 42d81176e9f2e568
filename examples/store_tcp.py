"""A TCP store server and four clients in one process: a barrier, a counter and a leader key.

Run: ``python examples/store_tcp.py``
"""

from __future__ import annotations

import anyio

from aioelastic.store import TCPStore, TCPStoreServer

WORKERS = 4


async def worker(rank: int, port: int) -> None:
    async with TCPStore("127.0.0.1", port) as store:
        arrived = await store.add("arrived", 1)  # atomic counter
        if arrived == WORKERS:
            await store.set("all-here", b"go")  # the last one in opens the barrier
        await store.get("all-here", timeout=10)  # waits server-side, no polling
        leader = await store.compare_set("leader", b"", f"rank {rank}".encode())
        print(f"rank {rank}: joined as #{arrived}, leader is {leader.decode()}")


async def main() -> None:
    async with TCPStoreServer() as server:  # loopback, a free port
        async with anyio.create_task_group() as tg:
            for rank in range(WORKERS):
                tg.start_soon(worker, rank, server.port)
        print(f"served on port {server.port}: {server.statistics().requests} requests")


if __name__ == "__main__":
    anyio.run(main)
