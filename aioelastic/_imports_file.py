"""A worker's imports, recorded in a file for the agent's fork template to learn.

Why: a module a worker imports lazily (``torch._dynamo``, which the first
``DistributedDataParallel(...)`` of a process imports: seconds) is pure Python, so it never shows
in the worker's ``/proc/PID/maps``, and a plain script reports nothing itself. When the agent
names a file in :data:`IMPORTS_FILE_ENV` (it does for local rank 0 of its plainly started
workers while its template learns: ``agent/_learned.py``), the worker site
(``_worker_site/sitecustomize.py``) installs an :class:`ImportRecorder` first in
``sys.meta_path``: it appends the name of each module the process starts importing to the file,
one a line, and finds nothing itself. Each name is one unbuffered ``O_APPEND`` write, so what a
killed worker imported is in the file up to its end.

Only imports are recorded: a ``find_spec`` call under the module's import lock (a lookup such as
``importlib.util.find_spec("triton")``, which a library makes to see what is installed, holds
none). An import that then fails is recorded too; the template skips it.

The site takes the variable out of the environment: the script and the programs it starts do not
see it (a Python child would not record anyway, the site is off its path). A child forked by the
worker (a data loader's) keeps the recorder and appends too: the same script's imports.

Only the standard library is imported here: this runs in every worker before its script.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence
from typing import Any

IMPORTS_FILE_ENV = "AIOELASTIC_IMPORTS_FILE"
"""Names the file a worker appends the names of its imports to (set by the agent, read and
removed by the worker site)."""


def _import_locks() -> Any:
    """The import system's table of the module locks held by imports in progress (None if this
    interpreter has none: then every lookup counts as an import)."""
    bootstrap = sys.modules.get("_frozen_importlib")  # importlib._bootstrap, as the VM runs it
    return getattr(bootstrap, "_module_locks", None)


class ImportRecorder:
    """A meta path finder that finds nothing and appends each name it is asked about to ``fd``
    when an import asks (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._locks = _import_locks()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: Any = None
    ) -> None:
        """Record ``fullname`` if an import is looking for it; never find it."""
        fd, locks = self._fd, self._locks
        if fd is not None and (locks is None or fullname in locks):
            try:
                os.write(fd, f"{fullname}\n".encode())
            except (OSError, UnicodeError):
                self._fd = None  # the file is gone or full: stop, never fail an import
        return None


def record_imports(environ: MutableMapping[str, str] = os.environ) -> ImportRecorder | None:
    """If ``environ`` names a file in :data:`IMPORTS_FILE_ENV`, take the variable out and record
    this process's imports into that file from now on; the recorder, or None."""
    path = environ.pop(IMPORTS_FILE_ENV, None)
    if not path:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None  # the agent is gone, or the file unusable: nothing to learn for
    recorder = ImportRecorder(fd)
    sys.meta_path.insert(0, recorder)
    return recorder
