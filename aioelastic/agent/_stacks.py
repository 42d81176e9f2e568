"""Stacks of hung workers, pure: parse what py-spy or faulthandler printed, tell the culprit.

Theory of operation. When a shared scope times out, every rank looks hung; the ranks that wait
for a stuck peer sit in a collective (``all_reduce``, ``barrier``, ...) while the peer sits
somewhere else. Each rank's main thread is reduced to a *place*: the collective it waits in
(the torch.distributed entry point nearest the top of the stack), or else the innermost frame
outside the standard library. Ranks are grouped by place; the suspects are the ranks that are
not waiting in a collective while others are or, failing that, the minority places (a rank in
another collective than its peers is the one out of step; all of them when every place is as
common). No I/O here: callers capture.
"""

from __future__ import annotations

import json
import re
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame: function name, file and line."""

    name: str
    filename: str
    line: int

    @property
    def short(self) -> str:
        """``data.py:88 load_batch``."""
        return f"{self.filename.rsplit('/', 1)[-1]}:{self.line} {self.name}"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's frames, innermost first."""

    name: str
    frames: tuple[Frame, ...]
    main: bool = False


@dataclass(frozen=True, slots=True)
class Place:
    """Where a rank's main thread is: ``waiting`` in a collective, or ``stuck`` somewhere."""

    waiting: bool
    where: str

    def describe(self) -> str:
        return f"{'waiting in' if self.waiting else 'stuck in'} {self.where}"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Ranks grouped by place, the suspects, and the one-line summary saying so."""

    groups: tuple[tuple[Place, tuple[int, ...]], ...]
    suspects: tuple[int, ...]
    missing: tuple[int, ...]
    """Ranks whose stack could not be captured."""
    summary: str


COLLECTIVE_PATH = "torch/distributed/"
_STDLIB = tuple({sysconfig.get_path(name).rstrip("/") + "/" for name in ("stdlib", "platstdlib")})
_WRAPPERS = frozenset({"wrapper", "inner", "_fn"})


def parse_py_spy(text: str) -> tuple[ThreadStack, ...]:
    """Threads from ``py-spy dump --json`` output (main thread first); raise ValueError."""
    try:
        data: Any = json.loads(text)
        threads = [
            ThreadStack(
                str(item.get("thread_name") or f"thread {item.get('os_thread_id')}"),
                tuple(
                    Frame(str(f["name"]), str(f["filename"]), int(f["line"]))
                    for f in item["frames"]
                ),
                main=item.get("thread_name") == "MainThread",
            )
            for item in data
        ]
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"py-spy printed something unexpected: {exc!r}") from None
    return tuple(sorted(threads, key=lambda t: not t.main))


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """Threads from a faulthandler dump (the main thread, listed last, comes first)."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        if match := _FH_THREAD.match(line):
            threads.append((f"thread {match.group(2)}", []))
        elif (match := _FH_FRAME.match(line)) and threads:
            threads[-1][1].append(Frame(match.group(3), match.group(1), int(match.group(2))))
    stacks = [ThreadStack(name, tuple(frames)) for name, frames in threads]
    if not stacks:
        return ()
    *others, main = stacks
    return (ThreadStack(main.name, main.frames, main=True), *others)


def format_threads(threads: Sequence[ThreadStack]) -> str:
    """The human text of a capture: each thread, innermost frame first (py-spy's layout)."""
    lines = []
    for thread in threads:
        lines.append(f"Thread {thread.name!r}{' (main)' if thread.main else ''}:")
        lines += [f"    {f.name} ({f.filename}:{f.line})" for f in thread.frames]
    return "\n".join(lines) + "\n"


def _in_stdlib(frame: Frame) -> bool:
    return frame.filename.startswith(_STDLIB) or frame.filename.startswith("<frozen")


def place_of(threads: Sequence[ThreadStack]) -> Place | None:
    """Where the main thread (or else the first) is; None for a capture without frames."""
    thread = next((t for t in threads if t.main), threads[0] if threads else None)
    if thread is None or not thread.frames:
        return None
    frames = thread.frames
    collective = None
    for frame in frames:  # the leading run of torch.distributed frames
        if COLLECTIVE_PATH not in frame.filename:
            break
        if not frame.name.startswith("_") and frame.name not in _WRAPPERS:
            collective = frame.name
    if collective is not None:
        return Place(True, collective)
    own = next((f for f in frames if not _in_stdlib(f)), frames[0])
    return Place(False, own.short)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0-2 and 4-7``, ``ranks 0, 2 and 3``."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None and prev is not None:
            if prev - start >= 2:
                runs.append(f"{start}-{prev}")
            else:  # "1 and 2" reads better than "1-2"
                runs += [str(r) for r in range(start, prev + 1)]
        start = prev = rank
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    listed = runs[0] if len(runs) == 1 else f"{', '.join(runs[:-1])} and {runs[-1]}"
    return f"ranks {listed}"


def diagnose(places: Mapping[int, Place | None]) -> Diagnosis:
    """Group ranks by place and name the suspects (see the module docstring)."""
    by_place: dict[Place, list[int]] = {}
    missing = sorted(rank for rank, place in places.items() if place is None)
    for rank, place in sorted(places.items()):
        if place is not None:
            by_place.setdefault(place, []).append(rank)
    stuck = [p for p in by_place if not p.waiting]
    if stuck and len(stuck) < len(by_place):
        suspect_places = stuck  # the others wait in a collective: for these
    else:
        largest = max((len(r) for r in by_place.values()), default=0)
        suspect_places = [p for p, r in by_place.items() if len(r) < largest] or list(by_place)
    groups = sorted(
        by_place.items(),
        key=lambda item: (item[0] not in suspect_places, len(item[1]), item[1]),
    )
    suspects = sorted(r for p in suspect_places for r in by_place[p])
    parts = [f"{rank_ranges(ranks)} {place.describe()}" for place, ranks in groups]
    if missing:
        parts.append(f"{rank_ranges(missing)}: no stack")
    return Diagnosis(
        groups=tuple((place, tuple(ranks)) for place, ranks in groups),
        suspects=tuple(suspects),
        missing=tuple(missing),
        summary="; ".join(parts) if parts else "no stack captured",
    )
