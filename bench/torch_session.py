"""CPU per request of the torch-protocol session itself: no socket, no loop turn.

Feeds encoded torch requests, one read each, to a :class:`TorchSession` over the server's own
:class:`MemoryStore` (the TCP server's arrangement: every request here is answered at once in
``receive``) and reports the process CPU per request, best of ``--turns``. Run it against two
trees in the same minutes to compare them (``PYTHONPATH=<tree> python -m bench.torch_session``);
what ``bench.store --torch-protocol`` measures also holds the kernel and the event loop.
"""

from __future__ import annotations

import argparse
import time

import anyio

from aioelastic.store import MemoryStore
from aioelastic.store._torch_codec import TorchOp, TorchRequest, encode_request
from aioelastic.store._torch_session import TorchService

VALIDATE = encode_request(TorchRequest(TorchOp.VALIDATE, (0x3C85F7CE,)))

WORKLOADS: dict[str, TorchRequest] = {
    "set": TorchRequest(TorchOp.SET, ("/key", b"value")),
    "get": TorchRequest(TorchOp.GET, ("/key",)),
    "add": TorchRequest(TorchOp.ADD, ("/counter", 1)),
    "wait (present)": TorchRequest(TorchOp.WAIT, (["/key"],)),
    "check": TorchRequest(TorchOp.CHECK, (["/key"],)),
    "multi_get 4": TorchRequest(TorchOp.MULTI_GET, (["/key"] * 4,)),
    "ping": TorchRequest(TorchOp.PING, (7,)),
}


async def _send(data: bytes) -> None:
    raise AssertionError("every request is answered in receive()")


def cpu_per_request(request: TorchRequest, count: int) -> float:
    """Microseconds of process CPU per ``request`` fed to a session, one read each."""
    store = MemoryStore()
    store.set_nowait("key", b"value")
    session = TorchService(store).session("bench", send=_send, hangup=lambda: None)
    session.receive(VALIDATE)
    data = encode_request(request)
    receive = session.receive
    start = time.process_time()
    for _ in range(count):
        if not receive(data) and request.op is not TorchOp.SET:
            raise AssertionError(f"no reply to {request.op.name}")
    return (time.process_time() - start) / count * 1e6


async def run(count: int, turns: int) -> None:
    """Print each workload's best turn (a session is made inside a running loop)."""
    print(f"{'workload':<16} {'us CPU per request (best of ' + str(turns) + ')':>36}")
    for name, request in WORKLOADS.items():
        best = min(cpu_per_request(request, count) for _ in range(turns))
        print(f"{name:<16} {best:>36.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000, help="requests per turn")
    parser.add_argument("--turns", type=int, default=5, help="turns per workload (best kept)")
    args = parser.parse_args()
    anyio.run(run, args.count, args.turns)


if __name__ == "__main__":
    main()
