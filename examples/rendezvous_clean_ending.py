"""A clean ending over c10d: three nodes in one process; the first serves the store.

Rank 0 closes the run and every node returns CLOSED: the store's host leaves last, once the
others read the close. Then a second run whose store host leaves while the round runs: the
others read that it left (PARTICIPANT_LOST), and joining again says the store's host was lost,
at once.
"""

from __future__ import annotations

import socket
from contextlib import AsyncExitStack

import anyio

from aioelastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousParameters,
    get_rendezvous_handler,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def node(handler: RendezvousHandler, name: str) -> None:
    """Join, let rank 0 close the run, and print how the round ended."""
    info = await handler.next_rendezvous()
    if info.rank == 0:
        await handler.set_closed()
    verdict = await handler.wait_round_invalidated()
    print(f"{name}: {verdict.reason.name}")


async def closed_by_rank_0() -> None:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{free_port()}", "job", min_nodes=3, max_nodes=3
    )
    async with AsyncExitStack() as stack:
        handlers = [
            await stack.enter_async_context(get_rendezvous_handler(params)) for _ in range(3)
        ]  # the first one entered serves the store, and its exit comes last
        async with anyio.create_task_group() as tg:
            for name, handler in zip("abc", handlers, strict=True):
                tg.start_soon(node, handler, name)


async def the_host_leaves_first() -> None:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{free_port()}", "job2", min_nodes=3, max_nodes=3
    )
    serving = anyio.Event()

    async def host() -> None:
        async with get_rendezvous_handler(params) as handler:  # the first: it serves
            serving.set()
            await handler.next_rendezvous()
        # leaving returned once b and c read that the host left

    async def other(name: str) -> None:
        async with get_rendezvous_handler(params) as handler:
            await handler.next_rendezvous()
            print(f"{name}: {(await handler.wait_round_invalidated()).reason.name}")
            try:
                await handler.next_rendezvous()
            except RendezvousConnectionError as error:
                print(f"{name}: {str(error).partition(': ')[2].partition(' (')[0]}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(host)
        await serving.wait()
        for name in "bc":
            tg.start_soon(other, name)


async def main() -> None:
    await closed_by_rank_0()
    await the_host_leaves_first()


if __name__ == "__main__":
    anyio.run(main)
