"""Two gloo ranks without an agent, for the abort tests: rank 1 SIGSTOPs itself after one
all_reduce (a peer that never answers, as on a lost host); rank 0, watched by an
:class:`~aioelastic.worker._abort.AbortWatch` on the socket the test passed it, enters a second
all_reduce and says how it left it, then forms a world of one in the same process.

``python abort_probe.py RANK PORT``; the test talks to rank 0's abort socket.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

from aioelastic.worker._abort import AbortWatch


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    long = datetime.timedelta(seconds=600)  # far beyond the test's bound: leaving is the abort's
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=long)
    watch = AbortWatch.start(1, {"host": "127.0.0.1", "port": port}) if rank == 0 else None
    dist.init_process_group("gloo", store=dist.PrefixStore("gen1", store), rank=rank,
                            world_size=2, timeout=long)  # fmt: skip
    total = torch.ones(1)
    dist.all_reduce(total)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    print(f"blocking pid {os.getpid()}", flush=True)
    try:
        dist.all_reduce(total)
        print("all_reduce returned", flush=True)
    except RuntimeError as exc:
        print(f"left on {type(exc).__name__}: {exc}", flush=True)
    assert watch is not None
    watch.stop()
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore("gen2", store), rank=0, world_size=1)
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"world of one: sum {int(total.item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
