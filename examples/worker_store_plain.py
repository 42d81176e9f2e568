"""Workers without torch meet in their world's store (``world.store``), one store a generation.

    aioelastic run --standalone --recovery in-place --nproc-per-node 2 \
        examples/worker_store_plain.py

Each rank checks in under its rank, waits for every rank of its generation and prints what they
wrote. Without torch ``world.store`` is an aioelastic :class:`~aioelastic.store.BlockingTCPStore`
scoped to the generation (with torch it would be torch's store over the same keys), so this
example hides torch to take that path on any machine.
"""

from __future__ import annotations

import os
import sys

sys.modules["torch"] = None  # type: ignore[assignment]  # as if torch were not installed

from aioelastic import worker  # noqa: E402


def main() -> None:
    for world in worker.worlds():
        with world:
            store = world.store
            store.set(f"rank/{world.rank}", f"pid {os.getpid()}")
            ranks = [f"rank/{rank}" for rank in range(world.world_size)]
            seen = [value.decode() for value in store.multi_get(ranks, timeout=60)]
            print(
                f"all {world.world_size} ranks of generation {world.generation} checked in: "
                f"{', '.join(seen)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
