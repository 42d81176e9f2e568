"""Timeouts that set themselves: ``timer.expires(after="auto", scope="step")``.

A scope's limit is learned from the durations of its blocks that finished: during a warm-up of
the first ``warmup`` observations the generous ``default`` applies; after it, the longest
duration observed so far times ``factor``, but never below ``floor``. A block that raised is
not an observation (a failed step says nothing about a healthy one's length).

The rule is pure (:func:`learned_limit`, :func:`merge`); :class:`LearnedTimeouts` keeps the
observations of one process and persists them as one small JSON file per rank in a directory
(the agent names it in ``AIOELASTIC_LEARNED_TIMEOUTS``), so a restarted worker starts from
what every rank learned before. A file is rewritten only while warming up or when the longest
duration grows, so a steady job writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEARNED_DIR_ENV = "AIOELASTIC_LEARNED_TIMEOUTS"

DEFAULT_FACTOR = 3.0
DEFAULT_FLOOR = 60.0
DEFAULT_WARMUP = 5
DEFAULT_LIMIT = 1800.0


@dataclass(frozen=True, slots=True)
class LearnedScope:
    """What is known of one scope: how many blocks finished and the longest of them."""

    observations: int = 0
    longest: float = 0.0

    def observe(self, seconds: float) -> LearnedScope:
        return LearnedScope(self.observations + 1, max(self.longest, seconds))


@dataclass(frozen=True, slots=True)
class LearningPolicy:
    """The learning rule's knobs (see the module docstring)."""

    factor: float = DEFAULT_FACTOR
    floor: float = DEFAULT_FLOOR
    warmup: int = DEFAULT_WARMUP
    default: float = DEFAULT_LIMIT

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and self.floor >= 0 and self.warmup >= 0 and self.default > 0):
            raise ValueError(f"need factor >= 1, floor >= 0, warmup >= 0, default > 0: {self}")


def learned_limit(scope: LearnedScope, policy: LearningPolicy) -> float:
    """The limit for the next block of ``scope``."""
    if scope.observations < policy.warmup or scope.observations == 0:
        return policy.default
    return max(policy.floor, scope.longest * policy.factor)


def merge(parts: Iterable[Mapping[str, LearnedScope]]) -> dict[str, LearnedScope]:
    """Several ranks' observations as one: per scope the most observations and the longest."""
    merged: dict[str, LearnedScope] = {}
    for part in parts:
        for name, scope in part.items():
            known = merged.get(name, LearnedScope())
            merged[name] = LearnedScope(
                max(known.observations, scope.observations), max(known.longest, scope.longest)
            )
    return merged


def document(scopes: Mapping[str, LearnedScope]) -> dict[str, Any]:
    """One rank's file, as JSON data."""
    body = {n: {"observations": s.observations, "longest": s.longest} for n, s in scopes.items()}
    return {"version": 1, "scopes": body}


def decode(text: str) -> dict[str, LearnedScope]:
    """One file's scopes; raise ValueError when it is not one."""
    try:
        data: Any = json.loads(text)
        return {
            str(name): LearnedScope(int(item["observations"]), float(item["longest"]))
            for name, item in data["scopes"].items()
        }
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a learned-timeouts file: {exc!r}") from None


def read_learned(directory: str | os.PathLike[str]) -> dict[str, LearnedScope]:
    """Every rank's observations in ``directory``, merged (unreadable files are skipped)."""
    parts = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(Path(directory).glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                parts.append(decode(path.read_text(encoding="utf-8")))
    return merge(parts)


def learned_limits(
    directory: str | os.PathLike[str], policy: LearningPolicy | None = None
) -> dict[str, float]:
    """The limit each scope in ``directory`` gets now (what ``status`` and the metrics show)."""
    chosen = policy or LearningPolicy()
    return {name: learned_limit(s, chosen) for name, s in read_learned(directory).items()}


class LearnedTimeouts:
    """One process's learned limits, kept in ``directory`` when given (see the module docs).

    ``now`` is the clock durations are measured on (monotonic; a test passes a manual clock's
    ``now``); ``name`` is this process's file name (default ``$RANK``, else the pid).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        policy: LearningPolicy | None = None,
        *,
        now: Callable[[], float] = time.monotonic,
        name: str | None = None,
    ) -> None:
        self.policy = policy or LearningPolicy()
        self.now = now
        self._path = None
        self._scopes: dict[str, LearnedScope] = {}
        if directory is not None:
            name = name or os.environ.get("RANK") or str(os.getpid())
            self._path = Path(directory, f"{name}.json")
            self._scopes = read_learned(directory)

    def __repr__(self) -> str:
        return f"LearnedTimeouts({self._path!r}, {self.policy!r})"

    def limit(self, scope: str) -> float:
        """The limit the next block of ``scope`` gets."""
        return learned_limit(self._scopes.get(scope, LearnedScope()), self.policy)

    def observe(self, scope: str, seconds: float) -> None:
        """Record that a block of ``scope`` finished after ``seconds``."""
        known = self._scopes.get(scope, LearnedScope())
        updated = self._scopes[scope] = known.observe(seconds)
        if self._path is not None and (
            updated.observations <= self.policy.warmup or updated.longest > known.longest
        ):
            self._save(self._path)

    def snapshot(self) -> dict[str, LearnedScope]:
        """What is known now, by scope."""
        return dict(self._scopes)

    def _save(self, path: Path) -> None:
        from aioelastic.errors import replace_json

        with contextlib.suppress(OSError):  # learning goes on in memory; a restart relearns
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_json(str(path), document(self._scopes))


_default: LearnedTimeouts | None = None


def default_learned() -> LearnedTimeouts:
    """The process's learner: in the directory the agent named, else in memory."""
    global _default
    if _default is None:
        _default = LearnedTimeouts(os.environ.get(LEARNED_DIR_ENV) or None)
    return _default
