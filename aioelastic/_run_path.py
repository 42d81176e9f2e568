"""``aioelastic run --run-path``: a worker runs its script through :func:`runpy.run_path`, and
an uncaught exception is recorded in ``TORCHELASTIC_ERROR_FILE`` without the script using
``@record`` (torchrun's ``--run-path`` records it the same way).

    python -u -m aioelastic._run_path SCRIPT [ARGS ...]

Only the standard library and :mod:`aioelastic.errors` are imported before the script runs.
"""

from __future__ import annotations

import os
import runpy
import sys

from aioelastic.errors import record


@record
def run_script(path: str, args: list[str]) -> None:
    """Run ``path`` as ``__main__`` with ``args``, as ``python path args`` would."""
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))  # its own directory, not ours
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m aioelastic._run_path SCRIPT [ARGS ...]")
    run_script(sys.argv[1], sys.argv[2:])
