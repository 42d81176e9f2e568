"""A c10d rendezvous whose store requires a token: two nodes join, an intruder is refused.

Run: ``python examples/secure_rendezvous.py``
"""

from __future__ import annotations

import secrets
import socket
import tempfile
from pathlib import Path

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
        port: int = sock.getsockname()[1]
        return port


async def join(handler: RendezvousHandler) -> None:
    info = await handler.next_rendezvous()
    print(f"joined: rank {info.rank} of {info.world_size}")


async def main() -> None:
    with tempfile.TemporaryDirectory() as private:
        token_file = Path(private) / "token"  # in a real job: the same file on every node
        token_file.write_text(secrets.token_hex(32))
        token_file.chmod(0o600)

        endpoint = f"127.0.0.1:{free_port()}"

        def node(**conf: str) -> RendezvousParameters:
            return RendezvousParameters("c10d", endpoint, "job", 2, 2, **conf)

        async with (
            get_rendezvous_handler(node(token_file=str(token_file))) as host,
            get_rendezvous_handler(node(token_file=str(token_file))) as peer,
        ):
            try:
                async with get_rendezvous_handler(node(is_host="false", read_timeout="5")):
                    pass
            except RendezvousConnectionError as error:
                print(f"intruder refused: {error}")
            async with anyio.create_task_group() as tg:
                tg.start_soon(join, host)
                tg.start_soon(join, peer)


if __name__ == "__main__":
    anyio.run(main)
