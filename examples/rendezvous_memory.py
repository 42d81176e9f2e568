"""Three nodes form a round in one event loop; a fourth arrives, the round re-forms with it.

Run: ``python examples/rendezvous_memory.py``. The ``memory`` backend keeps the rendezvous
in an in-process MemoryStore, which makes simulations and tests of elastic jobs instant;
``c10d`` (TCP store) and ``etcd`` run the same algorithm across hosts.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio

from aioelastic.rendezvous import RendezvousHandler, RendezvousParameters, get_rendezvous_handler

PARAMS = RendezvousParameters(
    "memory", "demo", "job", min_nodes=2, max_nodes=4, last_call_timeout="0.2"
)


async def join(name: str, handler: RendezvousHandler) -> None:
    info = await handler.next_rendezvous()
    print(f"{name}: rank {info.rank} of {info.world_size}")


async def main() -> None:
    names = ["a", "b", "c", "d"]
    handlers = {name: get_rendezvous_handler(PARAMS) for name in names}
    async with AsyncExitStack() as stack:
        for handler in handlers.values():
            await stack.enter_async_context(handler)
        print("round 1: a, b, c join (3 of at most 4: completes after the last call)")
        async with anyio.create_task_group() as tg:
            for name in names[:3]:
                tg.start_soon(join, name, handlers[name])
        print("d arrives; the members learn at once:")
        async with anyio.create_task_group() as tg:
            tg.start_soon(join, "d", handlers["d"])
            verdict = await handlers["a"].wait_round_invalidated()
            print(f"a: {verdict.reason.name}: {verdict.detail}")
            for name in names[:3]:  # max_nodes joined: completes at once; ranks are kept
                tg.start_soon(join, name, handlers[name])
        await handlers["a"].set_closed()


if __name__ == "__main__":
    anyio.run(main)
