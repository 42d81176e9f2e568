"""Torch's default process group destroyed before the interpreter finalizes, in every worker.

Why: a gloo worker thread may still be releasing a finished collective (dropping its tensors,
which takes the GIL) when a short script reaches ``Py_FinalizeEx``; CPython then ends that
thread mid-unwind through a ``noexcept`` C++ frame and the process dies of SIGABRT
("terminate called without an active exception"), about 1 run in 5 of a two-rank job that ends
right after its last collective, under torchrun too. ``destroy_process_group()`` joins those
threads first, so nothing is left for them to release. Torch asks scripts to call it; many do
not, so every Python worker ``aioelastic run`` starts calls it at exit (:mod:`._worker_site`)
and a :class:`~aioelastic.worker.World` calls it when it ends.

Only the standard library is imported here: this runs in every worker before its script.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

EXIT_DESTROY_TIMEOUT = 30.0
"""How long the exit hook lets ``destroy_process_group()`` run before the process exits anyway:
it waits for collectives still queued, which never finish if a peer hangs."""


def destroy_default_process_group() -> None:
    """Destroy torch's default process group if this process made one (torch not imported: no)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _destroy_at_exit(timeout: float) -> None:
    if "torch.distributed" not in sys.modules:  # the common case costs a dict lookup
        return
    timer = threading.Timer(timeout, _exit_stuck, args=(timeout,))
    timer.daemon = True
    timer.start()
    try:
        destroy_default_process_group()
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
