"""The fork template's checks (``_template_main.py``): what keeps a fork safe, and the rules
of a child's seed and path.

The judges are pure (they are given what they judge: ``/proc/self/status``, the descriptors,
the modules); :func:`fork_refusal` reads this process's state and asks them. Like the template
program, this module imports only the standard library: the template loads it by its path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

# -- the checks (pure: they are given what they judge) ----------------------------------------


def thread_refusal(
    status: str, python_threads: Sequence[str], os_threads: Sequence[str]
) -> str | None:
    """Why a process whose ``/proc/self/status`` is ``status`` must not fork (None: it may).

    ``python_threads`` names the threads :func:`threading.enumerate` knows besides the main
    one; ``os_threads`` the OS tasks' names (``comm``) besides the main one.
    """
    count = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 1
    )
    if count <= 1:
        return None
    named = ", ".join(repr(n) for n in python_threads) or "none (native threads only)"
    tasks = ", ".join(repr(n) for n in os_threads)
    return (
        f"the template has {count} threads and cannot fork safely: Python threads {named}; "
        f"OS threads {tasks}. A preloaded module started them on import: preload only modules "
        "that start no thread, or start the threads in the worker (after the fork)"
    )


def cuda_refusal(modules: Mapping[str, Any]) -> str | None:
    """Why forking is unsafe because torch initialised CUDA in this process (None: it did not)."""
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if is_initialized is None or not is_initialized():
        return None
    return (
        "CUDA is initialised in the template (a preloaded module created a CUDA context on "
        "import): a forked worker cannot use CUDA. Preload only modules that do not touch "
        "CUDA on import; workers initialise CUDA themselves after the fork"
    )


def socket_refusal(links: Mapping[int, str], own: Collection[int]) -> str | None:
    """Why forking would hand workers a socket (``links``: descriptor to its
    ``/proc/self/fd`` link; ``own``: the template's control socket). None: no such socket."""
    held = sorted(fd for fd, link in links.items() if link.startswith("socket:") and fd not in own)
    if not held:
        return None
    return (
        f"the template holds socket descriptor(s) {held}: a preloaded module opened a "
        "connection or a listening socket on import, which every worker would inherit. "
        "Preload only modules that open no socket on import"
    )


def fd_collision(
    targets: Sequence[int], links: Mapping[int, str], own: Collection[int]
) -> str | None:
    """Why a worker's descriptors cannot go where asked: a target is held by the template for
    something of its own (a preloaded module's file). None: every target is free or ours."""
    taken = [fd for fd in targets if fd > 2 and fd in links and fd not in own]
    if not taken:
        return None
    held = [links[fd] for fd in taken]
    return f"descriptor(s) {taken} of the worker are in use in the template ({held})"


def derive_seed(seed: int, rank: str, restart_count: str) -> int:
    """A 64-bit seed for the worker of ``rank`` at ``restart_count`` of a job seeded ``seed``."""
    material = f"{seed}/{rank}/{restart_count}".encode()
    return int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "big")


def script_path0(kind: str, target: str, cwd: str) -> str:
    """``sys.path[0]`` of ``python target`` (the script's real directory) or ``-m`` (``cwd``)."""
    if kind == "module":
        return cwd
    return os.path.dirname(os.path.realpath(os.path.join(cwd, target)))


# -- the process's own state ------------------------------------------------------------------


def open_descriptors() -> dict[int, str]:
    """This process's descriptors and what each is (``/proc/self/fd`` links)."""
    links = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
    return links


def os_thread_names() -> list[str]:
    """The ``comm`` of each OS thread of this process other than the main one."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            try:
                names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
            except OSError:
                continue
    return names


def idle_pool_stoppers() -> list[Any]:
    """OpenBLAS's ``blas_thread_shutdown_`` of each OpenBLAS this process loaded: it stops
    the library's idle worker threads (what its own fork handler does); they start again on
    the next BLAS call, in each child."""
    stoppers, seen = [], set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if "/" in line else ""
            if "openblas" in os.path.basename(path).lower() and path not in seen:
                seen.add(path)
                shutdown = getattr(ctypes.CDLL(path), "blas_thread_shutdown_", None)
                if shutdown is not None:
                    stoppers.append(shutdown)
    return stoppers


def fork_refusal(own: Collection[int], stoppers: Sequence[Any] = ()) -> str | None:
    """Why this process may not fork now (None: it may); the threads are checked last, once
    ``stoppers`` (see :func:`idle_pool_stoppers`) stopped the idle pools."""
    reason = cuda_refusal(sys.modules) or socket_refusal(open_descriptors(), own)
    if reason is not None:
        return reason
    for stop in stoppers:
        stop()
    python_threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    return thread_refusal(Path("/proc/self/status").read_text(), python_threads, os_thread_names())


def user_seeded(random_seeded: bool, torch_seeded: bool) -> frozenset[str]:
    """The generators a preloaded module seeded: those keep their seed in every child.
    NumPy's global seeding cannot be told apart from its import-time entropy: it is always
    reseeded."""
    return frozenset(
        name for name, seeded in (("random", random_seeded), ("torch", torch_seeded)) if seeded
    )
