"""Rank 0 frees a DDP after its world's process group was destroyed, while a gloo thread still
holds the world's last all_reduce and waits for the GIL to release it: the exact interleaving
of a rank that hung at exit (issue 37), made deterministic.

``ddp_last_owner.py STORE RANK``: two ranks over a FileStore at ``STORE``. Rank 0 starts an
all_reduce with a Python object in its thread-local state (what torch stashes for a backward),
destroys the group with ``aioelastic._process_group.destroy_default_process_group``, and from
then on holds the GIL (a switch interval of 1000 s and no call that releases it); rank 1 joins
the all_reduce only then, so the gloo thread finishes it and waits for the GIL. Rank 0 then
frees the DDP. Were its reducer the group's last owner, gloo's destructor would join that
thread with the GIL held, and rank 0 would never print ``rank 0 freed its DDP`` (without the
kept group: 6 hangs in 6 runs; with it: 6 exits in 6).
"""

from __future__ import annotations

import contextvars
import mmap
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from aioelastic._process_group import destroy_default_process_group


def world(store: dist.Store, rank: int, number: int) -> DDP:
    """A new default group (keys under ``number``) and a DDP built on it."""
    prefixed = dist.PrefixStore(str(number), store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=2)
    return DDP(torch.nn.Linear(2, 1))


def main() -> None:
    path, rank = sys.argv[1], int(sys.argv[2])
    store = dist.FileStore(path, 2)
    if rank == 0:
        with open(path + ".flag", "wb") as made:
            made.write(b"\0")
        store.set("flag", "made")
    store.wait(["flag"])
    with open(path + ".flag", "r+b") as file:
        flag = mmap.mmap(file.fileno(), 1)  # set by rank 0 without releasing its GIL
    ddp = world(store, rank, 1)  # torch keeps the group of a process's first DDP alive for good
    destroy_default_process_group()
    del ddp
    ddp = world(store, rank, 2)
    if rank == 1:
        store.wait(["destroyed"])
        while flag[0] == 0:  # until rank 0 holds its GIL for good
            pass
        dist.all_reduce(torch.ones(1))
        print("rank 1 done", flush=True)
        return
    total = torch.ones(1)
    seen = total.numpy()
    torch._C._stash_obj_in_tls("context", contextvars.copy_context())  # as a backward does
    dist.all_reduce(total, async_op=True)  # only the gloo thread keeps the work
    torch._C._remove_obj_from_tls("context")
    destroy_default_process_group()
    # Freed with the DDP, torch's Python wrapper of the group would release the GIL for a moment
    # (its destructor does), letting a thread already waiting for it through: the hang needed a
    # gloo thread that came later. Freed now, it leaves the reducer holding the group alone.
    del ddp.process_group
    store.set("destroyed", "1")
    sys.setswitchinterval(1000.0)  # the gloo thread waiting for the GIL never asks for it
    flag[0] = 1  # no call from here on releases the GIL
    while seen[0] != 2.0:
        pass
    del ddp
    print("rank 0 freed its DDP", flush=True)


if __name__ == "__main__":
    main()
