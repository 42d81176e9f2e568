"""A worker that cannot import torch and uses ``world.store`` (sync, or async with ``--async``).

Each world: every rank writes its pid under ``member/<rank>``, reads every rank's, and prints
``gen G rank R pid P size N members PIDS keys K`` (K: the keys this generation's store holds,
which must be exactly its members'); then it steps with ``world.check()`` until ``--exit-when``
exists. ``--die-early R``: in the first generation, rank R kills itself before it writes (the
others wait for it in ``multi_get`` until the world ends). ``--kill-rank R``: in the first
generation, rank R prints ``victim pid P`` once every member wrote (the test kills it).
torch is hidden (``sys.modules["torch"] = None``), so the path without torch runs on a
machine that has it.
"""

from __future__ import annotations

import sys

sys.modules["torch"] = None  # type: ignore[assignment]

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import anyio  # noqa: E402

from aioelastic import worker  # noqa: E402
from aioelastic.errors import record  # noqa: E402
from aioelastic.store import BlockingTCPStore, Store  # noqa: E402


def report(world: worker.World, pids: list[bytes], keys: int) -> None:
    members = ",".join(pid.decode() for pid in pids)
    print(
        f"gen {world.generation} rank {world.rank} pid {os.getpid()} size {world.world_size} "
        f"members {members} keys {keys}",
        flush=True,
    )


def run_sync(options: argparse.Namespace) -> None:
    for world in worker.worlds():
        with world:
            store = world.store
            assert isinstance(store, BlockingTCPStore), type(store)
            if world.generation == 1 and world.rank == options.die_early:
                print(f"dying early pid {os.getpid()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # before writing: the others wait for it
            store.set(f"member/{world.rank}", str(os.getpid()))
            pids = store.multi_get([f"member/{r}" for r in range(world.world_size)])
            report(world, pids, store.num_keys())
            if world.generation == 1 and world.rank == options.kill_rank:
                print(f"victim pid {os.getpid()}", flush=True)
            while not options.exit_when.exists():
                world.check()
                time.sleep(0.02)  # the step's "compute"  # pace
    print(f"done pid {os.getpid()}", flush=True)


async def run_async(options: argparse.Namespace) -> None:
    async for world in worker.async_worlds():
        async with world:
            store = world.store
            assert isinstance(store, Store), type(store)
            if world.generation == 1 and world.rank == options.die_early:
                print(f"dying early pid {os.getpid()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            await store.set(f"member/{world.rank}", str(os.getpid()))
            pids = await store.multi_get([f"member/{r}" for r in range(world.world_size)])
            report(world, pids, await store.num_keys())
            if world.generation == 1 and world.rank == options.kill_rank:
                print(f"victim pid {os.getpid()}", flush=True)
            while not options.exit_when.exists():
                world.check()
                await anyio.sleep(0.02)  # a step of an idle worker  # pace
    print(f"done pid {os.getpid()}", flush=True)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-when", type=Path, required=True)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--die-early", type=int, default=-1)
    parser.add_argument("--async", dest="use_async", action="store_true")
    options = parser.parse_args()
    print(f"asking pid {os.getpid()}", flush=True)
    if options.use_async:
        anyio.run(run_async, options)
    else:
        run_sync(options)


if __name__ == "__main__":
    main()
