"""The messages between an agent and its fork template (``--preload``): a pure codec.

Theory of operation: the agent and the template share a ``SOCK_SEQPACKET`` Unix socketpair,
so each message is one packet (no framing needed) and file descriptors ride along as
``SCM_RIGHTS`` data. The agent asks, the template answers, one request at a time and in order;
every request carries an id its answer repeats. The template sends one message unasked: its
answer to request 0, :class:`Ready` (or :class:`Refused`) once its modules are imported.

Agent to template: :class:`Fork` (start a worker: its entrypoint, environment, directory and
where each passed descriptor goes), :class:`Reap` (the worker ``pid`` has exited and its group
was killed: reap it and say its status), :class:`Import` (import more modules before the next
fork: strictly, or ``learned`` ones leniently). Template to agent: :class:`Ready`,
:class:`Forked`, :class:`Reaped`, :class:`Imported`, :class:`Refused` (the request could not
be done, and why).

Each message is a JSON object with a ``type``; :func:`decode` checks every field's type and
raises :class:`TemplateCodecError` on anything else, so a corrupt packet is never acted on.
This module imports only the standard library: the template imports it by path, without the
``aioelastic`` package.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 1 << 20
"""The largest packet either side sends or accepts (a worker's environment is most of it)."""
MAX_FDS = 16
"""The most descriptors one :class:`Fork` carries (stdin, stdout, stderr and passed ones)."""


class TemplateCodecError(ValueError):
    """A packet is not a valid template message; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class Fork:
    """Start a worker: ``python [options] target args`` where ``kind`` is ``script`` or
    ``module`` (``-m``). ``fds`` gives, for each descriptor attached in order, the number it
    gets in the worker (0, 1 and 2 first). ``seed`` feeds the child's reseeding."""

    id: int
    kind: str
    target: str
    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    fds: tuple[int, ...]
    seed: int


@dataclass(frozen=True, slots=True)
class Reap:
    """Worker ``pid`` exited and the agent killed its group: reap it, answer its status."""

    id: int
    pid: int


@dataclass(frozen=True, slots=True)
class Import:
    """Import ``modules`` (in order) before the next fork. ``learned``: they are what running
    workers had loaded, not what the user named: a failing import is skipped, and a module
    whose import would start a thread is left out, instead of refusing."""

    id: int
    modules: tuple[str, ...]
    learned: bool = False


@dataclass(frozen=True, slots=True)
class Ready:
    """The template imported its modules and may fork; ``modules`` is ``sys.modules``'s size."""

    id: int
    pid: int
    modules: int


@dataclass(frozen=True, slots=True)
class Forked:
    """The worker of request ``id`` runs as ``pid`` (its own session, set up)."""

    id: int
    pid: int


@dataclass(frozen=True, slots=True)
class Reaped:
    """Worker ``pid`` was reaped: ``returncode`` is its exit code or minus its signal."""

    id: int
    pid: int
    returncode: int


@dataclass(frozen=True, slots=True)
class Imported:
    """The modules of request ``id`` were imported and the template is still safe to fork;
    of learned ones, it holds ``modules`` now (imported, or loaded already) and left out
    ``left_out`` (their import would start a thread)."""

    id: int
    modules: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refused:
    """Request ``id`` was not done: ``reason`` says why and what to do. ``fatal``: the
    template can fork no more (a thread or CUDA started) and exits."""

    id: int
    reason: str
    fatal: bool = False


Request = Fork | Reap | Import
Reply = Ready | Forked | Reaped | Imported | Refused
Message = Request | Reply

_TYPES: dict[str, type[Any]] = {
    cls.__name__.lower(): cls
    for cls in (Fork, Reap, Import, Ready, Forked, Reaped, Imported, Refused)
}


def check_module_names(modules: Sequence[str]) -> tuple[str, ...]:
    """``modules`` if each is a dotted module name; raise ``ValueError`` naming a bad one."""
    for name in modules:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"{name!r} is not a module name (use e.g. torch,my_model)")
    return tuple(modules)


def encode(message: Message) -> bytes:
    """The packet carrying ``message``; raise :class:`TemplateCodecError` if it is too big."""
    fields: dict[str, Any] = {"type": type(message).__name__.lower()}
    for name in message.__dataclass_fields__:
        value = getattr(message, name)
        fields[name] = list(value) if isinstance(value, tuple) else value
    data = json.dumps(fields, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise TemplateCodecError(
            f"a {fields['type']} message of {len(data)} bytes exceeds {MAX_MESSAGE} bytes "
            "(an environment that large cannot be sent to the template)"
        )
    return data


def _int(fields: dict[str, Any], name: str) -> int:
    value = fields.get(name)
    if type(value) is not int:
        raise TemplateCodecError(f"field {name!r} must be an integer, not {value!r}")
    return value


def _str(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str):
        raise TemplateCodecError(f"field {name!r} must be a string, not {value!r}")
    return value


def _strs(fields: dict[str, Any], name: str) -> tuple[str, ...]:
    value = fields.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TemplateCodecError(f"field {name!r} must be a list of strings, not {value!r}")
    return tuple(value)


def _bool(fields: dict[str, Any], name: str) -> bool:
    value = fields.get(name, False)
    if not isinstance(value, bool):
        raise TemplateCodecError(f"field {name!r} must be a boolean, not {value!r}")
    return value


def _fork(fields: dict[str, Any]) -> Fork:
    env = fields.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise TemplateCodecError(f"field 'env' must map strings to strings, not {env!r}")
    fds = fields.get("fds")
    if (
        not isinstance(fds, list)
        or len(fds) > MAX_FDS
        or not all(type(fd) is int and fd >= 0 for fd in fds)
    ):
        raise TemplateCodecError(
            f"field 'fds' must list at most {MAX_FDS} descriptor numbers, not {fds!r}"
        )
    kind = _str(fields, "kind")
    if kind not in ("script", "module"):
        raise TemplateCodecError(f"field 'kind' must be 'script' or 'module', not {kind!r}")
    return Fork(
        _int(fields, "id"),
        kind,
        _str(fields, "target"),
        _strs(fields, "args"),
        env,
        _str(fields, "cwd"),
        tuple(fds),
        _int(fields, "seed"),
    )


def decode(data: bytes) -> Message:
    """The message in packet ``data``; raise :class:`TemplateCodecError` if it is not one."""
    if len(data) > MAX_MESSAGE:
        raise TemplateCodecError(f"a packet of {len(data)} bytes exceeds {MAX_MESSAGE} bytes")
    try:
        fields = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise TemplateCodecError(f"not a JSON message: {exc}") from None
    if not isinstance(fields, dict):
        raise TemplateCodecError(f"a message is a JSON object, not {type(fields).__name__}")
    kind = fields.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise TemplateCodecError(f"unknown message type {kind!r}")
    if cls is Fork:
        return _fork(fields)
    if cls is Import:
        return Import(_int(fields, "id"), _strs(fields, "modules"), _bool(fields, "learned"))
    if cls is Imported:
        return Imported(_int(fields, "id"), _strs(fields, "modules"), _strs(fields, "left_out"))
    if cls is Refused:
        return Refused(_int(fields, "id"), _str(fields, "reason"), _bool(fields, "fatal"))
    values = {name: _int(fields, name) for name in cls.__dataclass_fields__}
    return cls(**values)  # type: ignore[no-any-return]
