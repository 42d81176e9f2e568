"""Two gloo ranks without an agent, for the abort tests: rank 1 stops itself (SIGSTOP: a peer
that never answers, as on a lost host) after one all_reduce, or (``init``) before it even makes
its process group; rank 0, watched by an :class:`~aioelastic.worker._abort.AbortWatch` on the
socket the test passed it, blocks in a second all_reduce (or in ``init_process_group``), says
how it left it, then forms a world of one in the same process.

``python abort_probe.py RANK PORT [collective|init]``: the store is the test's (``aioelastic
store-server``, as an agent serves one); the test talks to rank 0's abort socket.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

from aioelastic.worker._abort import AbortWatch

LONG = datetime.timedelta(seconds=600)  # far beyond the tests' bound: leaving is the abort's


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    where = sys.argv[3] if len(sys.argv) > 3 else "collective"
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=LONG)
    forgotten = []
    watch = None
    if rank == 0:
        address = {"host": "127.0.0.1", "port": port}
        watch = AbortWatch.start(1, address, lambda: forgotten.append(True))
    if rank == 1 and where == "init":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if rank == 0 and where == "init":
        print(f"blocking pid {os.getpid()}", flush=True)
    try:
        dist.init_process_group("gloo", store=dist.PrefixStore("gen1", store), rank=rank,
                                world_size=2, timeout=LONG)  # fmt: skip
        total = torch.ones(1)
        dist.all_reduce(total)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        print(f"blocking pid {os.getpid()}", flush=True)
        dist.all_reduce(total)
        print("all_reduce returned", flush=True)
    except RuntimeError as exc:
        print(f"left on {type(exc).__name__}: {exc}", flush=True)
    assert watch is not None
    watch.stop()
    print(f"store forgotten: {bool(forgotten)}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    if forgotten:  # as the world does: its next world opens a new connection
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=LONG)
    dist.init_process_group("gloo", store=dist.PrefixStore("gen2", store), rank=0, world_size=1)
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"world of one: sum {int(total.item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
