"""Worker-side error reporting: the ``record`` decorator writes an uncaught exception to the file
the agent names in ``TORCHELASTIC_ERROR_FILE``, in torch's JSON layout, so either launcher's
failure report shows the worker's traceback.

```python
from aioelastic.errors import record

@record
def main() -> None:
    ...
```
The layout is ``{"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack":
"<traceback>", "timestamp": "<unix seconds>"}}}``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, overload

__all__ = ["ERROR_FILE_ENV", "error_file_payload", "record", "write_error_file"]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

P = ParamSpec("P")
R = TypeVar("R")


def error_file_payload(exc: BaseException, *, now: float) -> dict[str, Any]:
    """Return the JSON document describing ``exc`` (``now``: unix time of the failure)."""
    callstack = "".join(traceback.format_exception(exc))
    return {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(now))},
        }
    }


def write_error_file(exc: BaseException, path: str | None = None) -> str | None:
    """Write ``exc`` to ``path`` (default: ``$TORCHELASTIC_ERROR_FILE``); return the path used.

    Returns None, writing nothing, when no path is given or set: the worker was not started
    by an agent that collects errors.
    """
    path = path or os.environ.get(ERROR_FILE_ENV)
    if not path:
        return None
    replace_json(path, error_file_payload(exc, now=time.time()))
    return path


def replace_json(path: str, document: Any) -> None:
    """Write ``document`` to ``path`` as JSON in one step: a reader never sees half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fp:
        json.dump(document, fp)
    os.replace(tmp, path)


@overload
def record(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...
@overload
def record(fn: Callable[P, R]) -> Callable[P, R]: ...
def record(fn: Callable[P, Any]) -> Callable[P, Any]:
    """Decorate a worker's entry point so an uncaught exception reaches the agent's report.

    The exception is written to the error file and then re-raised unchanged. ``SystemExit`` and
    ``KeyboardInterrupt`` are not errors to report. Works on plain and ``async`` functions.
    """
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                write_error_file(exc)
                raise

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            write_error_file(exc)
            raise

    return wrapper
