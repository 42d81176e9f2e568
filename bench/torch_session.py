"""CPU per request of the store server's Python: no socket, no loop turn.

Feeds encoded requests, one read each, to the server's read callback
(:class:`~aioelastic.store._tcp_transport.ProtocolConnection`'s ``data_received``, over a
:class:`~aioelastic.store.TCPStoreServer`'s own :class:`MemoryStore`, with a transport that
drops what is written): torch's requests, as a torch client sends them, and ours. For torch's
it also feeds the :class:`TorchSession` alone (``receive``). Every request here is answered at
once. Reports the process CPU per request, best of ``--turns``. Run it against two trees in the
same minutes to compare them (``PYTHONPATH=<tree> python -m bench.torch_session``); what
``bench.store --torch-protocol`` measures also holds the kernel and the event loop.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import anyio

from aioelastic.store import TCPStoreServer
from aioelastic.store._tcp_codec import Op, encode_preamble
from aioelastic.store._tcp_codec import encode_request as encode_ours
from aioelastic.store._tcp_transport import ProtocolConnection
from aioelastic.store._torch_codec import TorchOp, TorchRequest, encode_request

VALIDATE = encode_request(TorchRequest(TorchOp.VALIDATE, (0x3C85F7CE,)))
VALUE = b"v" * 64

TORCH: dict[str, TorchRequest] = {
    "set": TorchRequest(TorchOp.SET, ("/key", VALUE)),
    "get": TorchRequest(TorchOp.GET, ("/key",)),
    "add": TorchRequest(TorchOp.ADD, ("/counter", 1)),
    "wait (present)": TorchRequest(TorchOp.WAIT, (["/key"],)),
    "check": TorchRequest(TorchOp.CHECK, (["/key"],)),
    "compare_set": TorchRequest(TorchOp.COMPARE_SET, ("/key", VALUE, VALUE)),
    "multi_get 4": TorchRequest(TorchOp.MULTI_GET, (["/key"] * 4,)),
    "ping": TorchRequest(TorchOp.PING, (7,)),
}

OURS: dict[str, bytes] = {
    "set": encode_ours(Op.SET, 7, "key", VALUE, None),
    "get": encode_ours(Op.GET, 7, "key", 60.0),
    "add": encode_ours(Op.ADD, 7, "counter", 1),
    "compare_set": encode_ours(Op.COMPARE_SET, 7, "key", VALUE, VALUE),
    "wait (present)": encode_ours(Op.WAIT, 7, ["key"], 60.0),
}


class _Transport:
    """Takes the replies and drops them."""

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 0) if name == "peername" else None

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def cpu_per_call(call: Callable[[], object], count: int) -> float:
    """Microseconds of process CPU per ``call()``."""
    start = time.process_time()
    for _ in range(count):
        call()
    return (time.process_time() - start) / count * 1e6


def connection(server: TCPStoreServer, first: bytes) -> ProtocolConnection:
    """A connection of ``server`` that has received ``first`` (its handshake)."""
    protocol = ProtocolConnection(server, handshake_timeout=60.0)
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    protocol.data_received(first)
    return protocol


def session_call(server: TCPStoreServer, data: bytes) -> Callable[[], object]:
    """The torch session of a fresh connection, fed ``data``."""
    torch = connection(server, VALIDATE).link.torch
    assert torch is not None
    return lambda: torch.receive(data)


async def run(count: int, turns: int) -> None:
    """Print each workload's best turn (connections are made inside a running loop)."""
    server = TCPStoreServer()
    server.store.set_nowait("key", VALUE)
    rows: list[tuple[str, Callable[[], Any]]] = []
    for name, request in TORCH.items():
        data = encode_request(request)
        rows.append((f"torch {name}: receive", session_call(server, data)))
        protocol = connection(server, VALIDATE)
        rows.append((f"torch {name}: read callback", partial_call(protocol, data)))
    for name, data in OURS.items():
        protocol = connection(server, encode_preamble() + encode_ours(Op.HELLO, 1, b""))
        rows.append((f"ours {name}: read callback", partial_call(protocol, data)))
    print(f"{'workload':<36} {'us CPU per request (best of ' + str(turns) + ')':>36}")
    for name, call in rows:
        best = min(cpu_per_call(call, count) for _ in range(turns))
        print(f"{name:<36} {best:>36.3f}")


def partial_call(protocol: ProtocolConnection, data: bytes) -> Callable[[], None]:
    return lambda: protocol.data_received(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000, help="requests per turn")
    parser.add_argument("--turns", type=int, default=5, help="turns per workload (best kept)")
    args = parser.parse_args()
    anyio.run(run, args.count, args.turns)


if __name__ == "__main__":
    main()
