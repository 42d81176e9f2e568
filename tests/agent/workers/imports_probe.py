"""A worker that imports a module of the tests' own, fails one import, only looks another up,
has a forked child import a module, and says whether it sees the imports file's variable."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

from aioelastic._imports_file import IMPORTS_FILE_ENV

print(f"variable {os.environ.get(IMPORTS_FILE_ENV)}", flush=True)
import lazy_marker  # noqa: E402, F401

with contextlib.suppress(ImportError):
    import no_such_module_q  # type: ignore[import-not-found]  # noqa: F401
assert importlib.util.find_spec("preload_marker") is not None  # looked up, never imported
assert "preload_marker" not in sys.modules
child = os.fork()
if child == 0:
    import colorsys  # noqa: F401

    os._exit(0)
os.waitpid(child, 0)
