"""A worker without torch for the warm-spare test: its first step imports ``colorsys``.

Each world prints ``gen G rank R pid P holds colorsys B`` when entered (B: whether the module
was loaded before the world's first step); a spare logs ``warming: imported ...`` once it
imported what the workers reported. It steps (``world.check()``) until FILE exists.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from pathlib import Path

from aioelastic import worker


def main() -> None:
    finish = Path(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("aioelastic.worker").setLevel(logging.INFO)
    for world in worker.worlds():
        with world:
            held = "colorsys" in sys.modules
            print(
                f"gen {world.generation} rank {world.rank} pid {os.getpid()} holds colorsys {held}",
                flush=True,
            )
            while not finish.exists():
                world.check()
                importlib.import_module("colorsys")  # what the first step loads
                time.sleep(0.02)  # the step's "compute"  # pace


if __name__ == "__main__":
    main()
