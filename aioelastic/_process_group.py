"""Torch's default process group destroyed before the interpreter finalizes, in every worker.

Why: a gloo worker thread may still be releasing a finished collective (dropping its tensors,
which takes the GIL) when a short script reaches ``Py_FinalizeEx``; CPython then ends that
thread mid-unwind through a ``noexcept`` C++ frame and the process dies of SIGABRT
("terminate called without an active exception"), about 1 run in 5 of a two-rank job that ends
right after its last collective, under torchrun too. ``destroy_process_group()`` joins those
threads first, so nothing is left for them to release. Torch asks scripts to call it; many do
not, so every Python worker ``aioelastic run`` starts calls it at exit (:mod:`._worker_site`)
and a :class:`~aioelastic.worker.World` calls it when it ends.

A destroyed group is kept (:data:`_RETIRED`) until the next one is destroyed or the process
exits: see :func:`destroy_default_process_group` for the deadlock that prevents.

Only the standard library is imported here: this runs in every worker before its script.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

EXIT_DESTROY_TIMEOUT = 30.0
"""How long the exit hook lets ``destroy_process_group()`` run before the process exits anyway:
it waits for collectives still queued, which never finish if a peer hangs."""


_RETIRED: list[Any] = []
"""The default process group :func:`destroy_default_process_group` destroyed last: one Python
reference, dropped at the next destroy or at exit."""
_DROPPED_AT_EXIT = False


def destroy_default_process_group() -> None:
    """Destroy torch's default process group if this process made one (torch not imported: no).

    The destroyed group stays referenced from here until the next call (which drops it) or
    exit, so that a ``DistributedDataParallel`` built on it, which usually outlives its world
    (a local of the training function), is never the group's last owner. Its reducer is freed
    with the GIL held, and gloo's destructor joins the group's worker threads, while one of
    them may still be releasing the last ``all_reduce``, whose saved thread-local state holds
    a Python object (the ``contextvars`` context torch stashes for a backward): that release
    waits for the GIL, the join waits for the thread, and the rank never exits. Torch's Python
    wrapper of a group releases the GIL before destroying it, so dropping it here is safe.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    group = dist.group.WORLD
    dist.destroy_process_group()
    global _DROPPED_AT_EXIT
    if not _DROPPED_AT_EXIT:  # also where no exit hook was installed (torchrun, say)
        _DROPPED_AT_EXIT = True
        atexit.register(_destroy_at_exit, EXIT_DESTROY_TIMEOUT)
    _RETIRED[:] = [group]  # the previous world's group goes: its DDP was replaced by now


def _destroy_at_exit(timeout: float) -> None:
    if "torch.distributed" not in sys.modules:  # the common case costs a dict lookup
        return
    timer = threading.Timer(timeout, _exit_stuck, args=(timeout,))
    timer.daemon = True
    timer.start()
    try:
        destroy_default_process_group()
        _RETIRED.clear()  # the script's DDP is gone: the groups' threads are joined now
    except Exception as exc:  # the script has ended: say why, never mask its own exit
        print(f"aioelastic: destroy_process_group() at exit failed: {exc!r}", file=sys.stderr)
    finally:
        timer.cancel()


def _exit_stuck(timeout: float) -> None:
    print(
        f"aioelastic: destroy_process_group() at exit did not return within {timeout:g} s (a "
        "collective is still waiting for a peer); exiting without it",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def install_exit_hook(timeout: float = EXIT_DESTROY_TIMEOUT) -> None:
    """Destroy the default process group at exit, after the script's own ``atexit`` handlers.

    Installed before the script runs, the hook is the last ``atexit`` handler to run (they run
    last-in, first-out), while the interpreter is still whole.
    """
    atexit.register(_destroy_at_exit, timeout)
