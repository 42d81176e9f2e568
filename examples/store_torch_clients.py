"""A torch ``TCPStore`` client against our store server: one port, one keyspace.

    python examples/store_torch_clients.py

The torch client runs in a thread here (a short call); torch's waiting calls can hold the GIL,
so long-waiting torch clients belong in their own process.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
import torch.distributed as dist

from aioelastic.store import TCPStore, TCPStoreServer


async def main() -> None:
    async with TCPStoreServer() as server:  # loopback, a free port
        port = server.port

        def torch_side() -> bytes:
            client = dist.TCPStore("127.0.0.1", port, is_master=False)
            client.set("from-torch", "hello")
            client.add("counter", 2)
            value: bytes = client.get("from-torch")
            return value

        print("torch read", await anyio.to_thread.run_sync(torch_side))
        async with TCPStore("127.0.0.1", port) as ours:  # our client, same port
            print("ours read", await ours.get("from-torch"))
            print("counter", await ours.add("counter", 1))


if __name__ == "__main__":
    anyio.run(main)
