"""The worker site: the ``PYTHONPATH`` that loads the exit hook's ``sitecustomize`` into each
Python worker (``aioelastic/_worker_site``), and the environment it leaves once loaded."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from aioelastic._imports_file import IMPORTS_FILE_ENV

WORKER_SITE = str(Path(__file__).parents[1] / "_worker_site")
"""The directory whose ``sitecustomize`` installs a Python worker's exit hook."""


def worker_site_env(base: Mapping[str, str]) -> dict[str, str]:
    """Return the ``PYTHONPATH`` that loads :data:`WORKER_SITE` first in a Python worker.

    Its ``sitecustomize`` destroys torch's process group at exit (see
    :mod:`aioelastic._process_group`), then restores ``base``'s path for the script.
    """
    given = base.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([WORKER_SITE, given] if given else [WORKER_SITE])}


def loads_worker_site(env: Mapping[str, str]) -> bool:
    """Whether a Python worker with ``env`` loads the ``sitecustomize`` of :data:`WORKER_SITE`."""
    return env.get("PYTHONPATH", "").split(os.pathsep)[0] == WORKER_SITE


def without_worker_site(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as the ``sitecustomize`` of :data:`WORKER_SITE` leaves it once loaded: a worker
    forked from a template that loaded it (the exit hook is inherited) gets this one. It has
    no :data:`~aioelastic._imports_file.IMPORTS_FILE_ENV` either: a fork records nothing."""
    left = {name: value for name, value in env.items() if name != IMPORTS_FILE_ENV}
    if not loads_worker_site(left):
        return left
    paths = left.pop("PYTHONPATH").split(os.pathsep)
    return {**left, "PYTHONPATH": os.pathsep.join(paths[1:])} if len(paths) > 1 else left
