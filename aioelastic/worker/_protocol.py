"""The agent-worker link under ``--recovery in-place``: messages as data, one JSON object a line.

The agent gives each worker one end of a socket pair (its number in ``AIOELASTIC_WORKER_FD``).
The worker says :class:`Hello` when it asks for a world, :class:`Enter` when it enters one and
:class:`Trouble` when an exception left ``with world:`` (is it the world's end, or the worker's
own bug?), and once :class:`Loaded` (the modules it has loaded, see ``_warm.py``). The agent
sends :class:`WorldAssigned`, :class:`WorldEnded`, :class:`StillValid` (the answer to
:class:`Trouble` when no end came within the grace), :class:`NoMoreWorlds`, and to an idle spare
:class:`Warm` (modules to import while it waits). Pure: no I/O here; both sides frame with
:class:`LineDecoder`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Generic, TypeVar

WORKER_FD_ENV = "AIOELASTIC_WORKER_FD"
"""The environment variable naming the worker's end of its link to the agent."""

MAX_LINE = 64 * 1024
"""No message is longer; a longer line means the peer is not speaking this protocol."""


class LinkProtocolError(Exception):
    """The other end sent something that is not a message of the agent-worker link."""


@dataclass(frozen=True, slots=True)
class Hello:
    """Worker -> agent: this process asks for a world (``worker.worlds()``)."""

    pid: int


@dataclass(frozen=True, slots=True)
class Enter:
    """Worker -> agent: it entered ``generation`` (``with world:``)."""

    generation: int


@dataclass(frozen=True, slots=True)
class Trouble:
    """Worker -> agent: an exception is leaving ``with world:`` of ``generation``."""

    generation: int
    error: str


@dataclass(frozen=True, slots=True)
class Loaded:
    """Worker -> agent: modules it has loaded, in import order (a long list comes in several
    messages, see :func:`chunked`)."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WorldAssigned:
    """Agent -> worker: its place in a generation, and where that generation's store is."""

    generation: int
    rank: int
    world_size: int
    local_rank: int
    is_fresh: bool
    source_rank: int
    fresh_ranks: tuple[int, ...]
    store: dict[str, Any]
    """``{"kind": "file", "path": ...}`` or ``{"kind": "tcp", "host", "port", "prefix"}``."""
    timeout: float
    """Seconds a collective of this world may block before it raises (the process group's)."""


@dataclass(frozen=True, slots=True)
class WorldEnded:
    """Agent -> worker: ``generation`` is over (a member failed or left, or a node joined)."""

    generation: int
    reason: str


@dataclass(frozen=True, slots=True)
class StillValid:
    """Agent -> worker: ``generation`` did not end; the exception is the worker's own."""

    generation: int


@dataclass(frozen=True, slots=True)
class NoMoreWorlds:
    """Agent -> worker: there will be no further world (the job finished); leave the loop."""

    reason: str


@dataclass(frozen=True, slots=True)
class Warm:
    """Agent -> idle spare: import these modules while waiting (the job's workers have them)."""

    names: tuple[str, ...]


Message = (
    Hello | Enter | Trouble | Loaded | WorldAssigned | WorldEnded | StillValid | NoMoreWorlds | Warm
)
M = TypeVar("M")

_KINDS: dict[str, type[Message]] = {
    cls.__name__: cls
    for cls in (
        Hello,
        Enter,
        Trouble,
        Loaded,
        WorldAssigned,
        WorldEnded,
        StillValid,
        NoMoreWorlds,
        Warm,
    )
}

CHUNK = MAX_LINE // 2
"""Bytes of names in one :class:`Loaded` or :class:`Warm` message (well under a line)."""


def chunked(kind: type[Loaded] | type[Warm], names: Sequence[str]) -> list[Loaded | Warm]:
    """``names`` as messages of ``kind``, each line well under :data:`MAX_LINE`, in order."""
    messages: list[Loaded | Warm] = []
    chunk: list[str] = []
    size = 0
    for name in names:
        if len(name) > CHUNK:
            continue  # no module has such a name; it could not travel
        if size + len(name) + 4 > CHUNK:
            messages.append(kind(tuple(chunk)))
            chunk, size = [], 0
        chunk.append(name)
        size += len(name) + 4
    if chunk:
        messages.append(kind(tuple(chunk)))
    return messages


def encode(message: Message) -> bytes:
    """One line: ``{"kind": ..., fields...}`` and a newline."""
    return json.dumps({"kind": type(message).__name__, **asdict(message)}).encode() + b"\n"


def decode(line: bytes) -> Message:
    """Parse one line written by :func:`encode`; raise :class:`LinkProtocolError`."""
    try:
        data = json.loads(line)
        cls = _KINDS[data.pop("kind")]
        values = {f.name: data[f.name] for f in fields(cls)}
        if "fresh_ranks" in values:
            values["fresh_ranks"] = tuple(int(r) for r in values["fresh_ranks"])
        if "names" in values:
            if not all(isinstance(name, str) for name in values["names"]):
                raise TypeError("names must be strings")
            values["names"] = tuple(values["names"])
        return cls(**values)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LinkProtocolError(f"not a message of the agent-worker link: {line[:80]!r}") from exc


class Lines(Generic[M]):
    """Splits a byte stream into newline-framed messages, each read by ``decode_line``.

    A line longer than ``max_line`` raises ``error``: the peer is not speaking the protocol.
    """

    def __init__(
        self,
        decode_line: Callable[[bytes], M],
        error: type[LinkProtocolError] = LinkProtocolError,
        max_line: int = MAX_LINE,
    ) -> None:
        self._decode_line = decode_line
        self._error = error
        self._max_line = max_line
        self._buffer = b""

    def feed(self, data: bytes) -> list[M]:
        """Add received bytes; return the complete messages among them, in order."""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > self._max_line:
            raise self._error(f"a line longer than {self._max_line} bytes")
        return [self._decode_line(line) for line in lines if line]


class LineDecoder(Lines[Message]):
    """Splits the agent-worker link's bytes into messages."""

    def __init__(self) -> None:
        super().__init__(decode)
