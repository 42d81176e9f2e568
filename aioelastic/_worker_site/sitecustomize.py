"""Loaded by ``site`` in each Python worker that ``aioelastic run`` starts (this directory leads
the worker's ``PYTHONPATH``): installs :func:`aioelastic._process_group.install_exit_hook` and,
when the agent asks for it, the recorder of the worker's imports
(:func:`aioelastic._imports_file.record_imports`), then takes this directory off ``sys.path``
and ``PYTHONPATH`` and loads the ``sitecustomize`` the worker would have loaded without it, so
the script, and what it starts, sees its own path.
"""

from __future__ import annotations

import importlib
import os
import sys


def _record_imports(path: str) -> None:
    """Run :func:`aioelastic._imports_file.record_imports` from ``path``, the copy of the
    agent that named the file (whatever ``aioelastic`` the worker's own path holds)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("aioelastic._imports_file", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.record_imports()


def _load() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    given = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if given and given[0] == here:
        if len(given) > 1:
            os.environ["PYTHONPATH"] = os.pathsep.join(given[1:])
        else:
            del os.environ["PYTHONPATH"]
    from aioelastic._process_group import install_exit_hook

    install_exit_hook()
    _record_imports(os.path.join(os.path.dirname(here), "_imports_file.py"))
    ours = sys.modules.pop(__name__)
    try:
        importlib.import_module(__name__)
    except ModuleNotFoundError as exc:
        if exc.name != __name__:
            raise
        sys.modules[__name__] = ours  # site's import expects a module under this name


_load()
