"""A worker's command line as the fork template runs it, and the template's environment."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "-Q"})


@dataclass(frozen=True, slots=True)
class PythonCommand:
    """A worker's command line as the template runs it: ``interpreter [options] target args``
    (``kind`` ``script``, or ``module`` for ``-m target``)."""

    interpreter: str
    options: tuple[str, ...]
    kind: str
    target: str
    args: tuple[str, ...]


def python_command(argv: Sequence[str]) -> PythonCommand:
    """Split a worker's ``argv`` for the template; raise ``ValueError`` if it cannot be forked.

    Only ``python [options] script args`` and ``python [options] -m module args`` can: the
    template is an interpreter that imported the modules; a program, ``-c`` or stdin cannot.
    """
    if not argv:
        raise ValueError("the worker's command line is empty")
    interpreter, rest = argv[0], list(argv[1:])
    if "python" not in os.path.basename(interpreter):
        raise ValueError(
            f"--preload forks Python workers, but the worker program is {interpreter!r} "
            "(drop --no-python, or --preload)"
        )
    options: list[str] = []
    while rest and rest[0].startswith("-") and rest[0] not in ("-", "--"):
        option = rest.pop(0)
        if option == "-m":
            if not rest:
                raise ValueError("-m needs a module name")
            return PythonCommand(interpreter, tuple(options), "module", rest[0], tuple(rest[1:]))
        if option.startswith("-c"):
            raise ValueError("--preload cannot fork a worker run with python -c")
        options.append(option)
        if option in _OPTIONS_WITH_VALUE:
            if not rest:
                raise ValueError(f"python option {option} needs a value")
            options.append(rest.pop(0))
    if rest and rest[0] == "--":
        rest.pop(0)
    if not rest or rest[0] == "-":
        raise ValueError("--preload needs a script or -m module to run (not stdin)")
    return PythonCommand(interpreter, tuple(options), "script", rest[0], tuple(rest[1:]))


def template_env(
    base: Mapping[str, str], extra: Mapping[str, str], local_world_size: int
) -> dict[str, str]:
    """The template's environment: what every worker's holds at import time (their rank
    variables aside), so that libraries read the same settings (``OMP_NUM_THREADS``) on
    import as they would in a plain worker."""
    env = {**base, **extra}
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env
