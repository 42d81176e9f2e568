"""What a node's workers have loaded, learned while they run, for the fork template.

Why: a restarted or replacement worker that starts plainly imports its modules again
(``import torch`` alone takes seconds). Without ``--preload`` the agent learns what its workers
load and has the template (``_template.py``) import it, so that every later start forks from a
process as warm as a worker: restart, replacement, spare. The first start stays a plain one,
exactly as torchrun's.

Three sources, none of which needs the user's script to help: the installed packages whose
compiled code a worker's process has mapped (``/proc/PID/maps``: ``import torch`` is most of a
start); the names of the modules a plainly started worker imported, in order, which the worker
site appends to a file the agent names (:mod:`aioelastic._imports_file`: pure-Python modules
imported lazily, such as ``torch._dynamo`` in the first ``DistributedDataParallel(...)``, never
show in the maps); and the module names a linked worker reported after its first step
(``--recovery in-place``: ``worker/_warm.py``). The rules are pure functions here;
:func:`read_maps`, :class:`ImportsFile` and :func:`watch` are the only I/O.
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


def complete_lines(data: bytes) -> tuple[list[str], int]:
    """The names in ``data`` (one a line, as :mod:`aioelastic._imports_file` writes them) up to
    its last newline, and how many bytes those lines take (a line still being written waits
    for the next read); a line that is not a module name is left out."""
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode(errors="replace").splitlines()
    names = [line for line in lines if line and all(p.isidentifier() for p in line.split("."))]
    return names, end


class ImportsFile:
    """The file the worker site appends a worker's imports to, read from where the last
    :meth:`read_new` stopped (workers started plainly again append to it too)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0

    def read_new(self) -> list[str]:
        """The names appended since the last call ([] while there is no file)."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                names, used = complete_lines(file.read())
        except OSError:
            return []
        self._offset += used
        return names


async def watch(
    pids: Callable[[], Sequence[int]],
    reported: Callable[[], Sequence[str]],
    learn: Callable[[Sequence[str]], None],
    imports: ImportsFile | None = None,
    *,
    first_look: float = FIRST_LOOK,
) -> None:
    """Tell ``learn`` what the workers ``pids()`` have loaded (their packages from their
    maps, then the names the worker site wrote to ``imports`` in import order, then those
    ``reported()`` by linked workers) once it stopped growing (one look found nothing new:
    the template's imports then compete with the workers' training, not with their start);
    look first after ``first_look`` seconds, then after intervals that double up to
    :data:`LAST_INTERVAL`. Runs until cancelled."""
    known: set[str] = set()
    pending: list[str] = []
    delay = first_look
    while True:
        await anyio.sleep(delay)
        delay = min(delay * 2, LAST_INTERVAL)
        names = [name for pid in pids() for name in packages_in_maps(read_maps(pid))]
        names += imports.read_new() if imports is not None else []
        new = [name for name in dict.fromkeys([*names, *reported()]) if name not in known]
        known.update(new)
        pending += new
        if pending and not new:
            logger.debug("the workers loaded %d module(s) more: %s", len(pending), pending[:10])
            learn(pending)
            pending = []
