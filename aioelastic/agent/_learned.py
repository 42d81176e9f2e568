"""What a node's workers have loaded, learned while they run, for the fork template.

Why: a restarted or replacement worker that starts plainly imports its modules again
(``import torch`` alone takes seconds). Without ``--preload`` the agent learns what its workers
load and has the template (``_template.py``) import it, so that every later start forks from a
process as warm as a worker: restart, replacement, spare. The first start stays a plain one,
exactly as torchrun's.

Two sources, both read by the agent without the workers' help: the installed packages whose
compiled code a worker's process has mapped (``/proc/PID/maps``: a plain training script says
nothing else, and ``import torch`` is most of its start), and the module names a linked worker
reported after its first step (``--recovery in-place``: ``worker/_warm.py``). The rules are
pure functions here; :func:`read_maps` and :func:`watch` are the only I/O.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import PurePosixPath

import anyio

logger = logging.getLogger(__name__)

SITE_DIRECTORIES = frozenset({"site-packages", "dist-packages"})
"""Where installed packages live (``dist-packages``: Debian's interpreters)."""
FIRST_LOOK, LAST_INTERVAL = 5.0, 30.0
"""Seconds before the first look at the workers, and the most between two looks (the interval
doubles: a job's imports happen early). What is learned is handed on at a look that found
nothing new, so no sooner than the second look (10 s): a job that ends sooner never needed a
template, and the template's imports do not slow the workers' own start."""
OUR_PACKAGE = "aioelastic"


def packages_in_maps(maps: str) -> list[str]:
    """The top-level names of the installed packages (and single-file extension modules)
    whose files a process has mapped, in the order of ``maps`` (a ``/proc/PID/maps`` text);
    names that are not importable identifiers (``numpy.libs``) are left out."""
    found: dict[str, None] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        parts = PurePosixPath(fields[5].removesuffix(" (deleted)")).parts
        sites = [i for i, part in enumerate(parts[:-1]) if part in SITE_DIRECTORIES]
        if not sites:
            continue
        top = parts[sites[-1] + 1]
        if sites[-1] + 2 == len(parts):  # a file right in site-packages: a module of its own
            top = top.split(".", 1)[0]
        if top.isidentifier() and top != OUR_PACKAGE:
            found[top] = None
    return list(found)


def worth_a_template(names: Iterable[str]) -> bool:
    """Whether a process holding ``names`` saves a start anything: some name is neither the
    standard library's nor ours (those import in milliseconds)."""
    ours = {*sys.stdlib_module_names, *sys.builtin_module_names, OUR_PACKAGE, "__main__"}
    return any(name.partition(".")[0] not in ours for name in names)


def read_maps(pid: int) -> str:
    """``/proc/PID/maps`` ("" once the process is gone or cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return maps.read()
    except OSError:
        return ""


async def watch(
    pids: Callable[[], Sequence[int]],
    reported: Callable[[], Sequence[str]],
    learn: Callable[[Sequence[str]], None],
) -> None:
    """Tell ``learn`` what the workers ``pids()`` have loaded (their packages from their
    maps, then the names ``reported()`` by linked workers) once it stopped growing (one look
    found nothing new: the template's imports then compete with the workers' training, not
    with their start); look again after intervals that double up to :data:`LAST_INTERVAL`.
    Runs until cancelled."""
    known: set[str] = set()
    pending: list[str] = []
    delay = FIRST_LOOK
    while True:
        await anyio.sleep(delay)
        delay = min(delay * 2, LAST_INTERVAL)
        names = [name for pid in pids() for name in packages_in_maps(read_maps(pid))]
        new = [name for name in dict.fromkeys([*names, *reported()]) if name not in known]
        known.update(new)
        pending += new
        if pending and not new:
            logger.debug("the workers loaded %d module(s) more: %s", len(pending), pending[:10])
            learn(pending)
            pending = []
