"""Stragglers from step marks: per-rank step-time medians over a window, scored (pure).

Theory of operation. Each worker's step marks (``world.step(n)``, see
``aioelastic/worker/_steps.py``) give one *sample* per step: the time from the mark of step
``n`` to the rank's ``world.work_done()`` in that step where it said it (its own work, without
waiting for slower peers in the step's collective), else to its next mark (divided by the
steps between, where marks skip steps). A sample belongs to the window its step began in;
windows are ``window`` seconds long, aligned on the first mark seen. A window closes once a
mark ``grace`` seconds past its end has been seen (marks arrive in batches, up to a flush
interval late). Then, for each rank with at least ``min_samples`` samples in it:

    median(r) = median of rank r's samples in the window
    score(r)  = min over ranks of median / median(r)        (1.0 for the fastest rank)
    straggler  <=>  median(r) > factor * fastest median      (score(r) < 1 / factor)

``factor`` defaults to 1 / 0.75: NVIDIA's resiliency extension flags a relative score under
0.75. In a job whose every step ends in a collective, all ranks share one step period: only
``work_done()`` tells the slow rank from those it keeps waiting. A rank that marks no step in a
window (hung, or gone) is not scored there: the watchdog's business, not this one's.

Live, each agent scores its own node's ranks; ``aioelastic report`` scores every rank of the
logs it reads, with the same code.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from aioelastic._kinds.agent import RankStepTime

DEFAULT_WINDOW = 60.0
"""Seconds of one window."""

DEFAULT_FACTOR = 1 / 0.75
"""How many times the fastest rank's median a rank's may be before it is a straggler."""

DEFAULT_GRACE = 1.0
"""Seconds past a window's end to wait for late batches before it closes (twice the flush)."""

WINDOW_ENV = "AIOELASTIC_STRAGGLER_WINDOW"
FACTOR_ENV = "AIOELASTIC_STRAGGLER_FACTOR"


@dataclass(frozen=True, slots=True)
class ScoredWindow:
    """A closed window: each scored rank (by rank) and the stragglers among them."""

    start: float
    end: float
    ranks: tuple[RankStepTime, ...]
    stragglers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StragglerSettings:
    """The window (seconds), the factor, and the fewest samples that give a rank a median."""

    window: float = DEFAULT_WINDOW
    factor: float = DEFAULT_FACTOR
    min_samples: int = 1
    grace: float = DEFAULT_GRACE

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window) and self.window > 0):
            raise ValueError(f"the straggler window must be > 0 seconds, got {self.window}")
        if not (math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(
                f"the straggler factor must be > 1 (1/0.75 flags a rank 33% slower than the "
                f"fastest), got {self.factor}"
            )
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> StragglerSettings:
        """Read ``AIOELASTIC_STRAGGLER_WINDOW`` and ``AIOELASTIC_STRAGGLER_FACTOR`` (defaults
        where unset); a bad value is a :class:`ValueError` naming the variable."""
        values = {WINDOW_ENV: DEFAULT_WINDOW, FACTOR_ENV: DEFAULT_FACTOR}
        for name in values:
            raw = environ.get(name, "").strip()
            if not raw:
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
        try:
            return cls(window=values[WINDOW_ENV], factor=values[FACTOR_ENV])
        except ValueError as error:
            raise ValueError(f"{error} (from {WINDOW_ENV} / {FACTOR_ENV})") from None


def score_window(
    start: float, end: float, samples: Mapping[int, list[float]], settings: StragglerSettings
) -> ScoredWindow:
    """Medians, scores and stragglers of one window's samples (rank -> step seconds)."""
    medians = {
        rank: statistics.median(values)
        for rank, values in samples.items()
        if len(values) >= settings.min_samples
    }
    if not medians:
        return ScoredWindow(start, end, (), ())
    fastest = min(medians.values())
    ranks = tuple(
        RankStepTime(rank, median, fastest / median if median > 0 else 1.0, len(samples[rank]))
        for rank, median in sorted(medians.items())
    )
    stragglers = tuple(
        r.rank for r in ranks if len(ranks) > 1 and r.median > settings.factor * fastest
    )
    return ScoredWindow(start, end, ranks, stragglers)


@dataclass(slots=True)
class _Open:
    """A rank's last marked step in one life whose sample is not taken yet."""

    step: int
    time: float
    sampled: bool = False


@dataclass(slots=True)
class StragglerWatch:
    """Feed step marks in; get each window as it closes (see the module docstring)."""

    settings: StragglerSettings = field(default_factory=StragglerSettings)
    origin: float | None = None
    latest: float = -math.inf
    closed: int = 0
    """Windows before this index are closed (samples for them are dropped)."""
    _open: dict[tuple[int, int, int], _Open] = field(default_factory=dict)
    _samples: dict[int, dict[int, list[float]]] = field(default_factory=dict)

    def feed(
        self,
        life: tuple[int, int],
        rank: int,
        steps: tuple[int, ...],
        times: tuple[float, ...],
        done: tuple[tuple[int, float], ...] = (),
    ) -> list[ScoredWindow]:
        """Take one batch of ``rank``'s marks in ``life`` (restart count, generation); return
        the windows that closed."""
        key = (life[0], life[1], rank)
        points = sorted(
            [(t, 0, s) for s, t in zip(steps, times, strict=True)] + [(t, 1, s) for s, t in done]
        )
        for when, is_done, step in points:
            if self.origin is None:
                self.origin = when
            self.latest = max(self.latest, when)
            last = self._open.get(key)
            if is_done:
                if last is not None and last.step == step and not last.sampled:
                    self._add(rank, last.time, when - last.time)
                    last.sampled = True
                continue
            if last is not None and not last.sampled and step > last.step:
                self._add(rank, last.time, (when - last.time) / (step - last.step))
            self._open[key] = _Open(step, when)
        return self._close(self.latest)

    def finish(self) -> list[ScoredWindow]:
        """Close every window still open (the log ended)."""
        return self._close(math.inf)

    def _index(self, when: float) -> int:
        assert self.origin is not None
        return int((when - self.origin) // self.settings.window)

    def _add(self, rank: int, start: float, seconds: float) -> None:
        index = self._index(start)
        if index >= self.closed and seconds >= 0:
            self._samples.setdefault(index, {}).setdefault(rank, []).append(seconds)

    def _close(self, now: float) -> list[ScoredWindow]:
        if self.origin is None:
            return []
        window = self.settings.window
        if math.isfinite(now):  # window k ends at origin + (k + 1) * window
            closing = self._index(now - self.settings.grace)
        else:
            closing = max(self._samples, default=self.closed - 1) + 1
        scored = []
        for index in sorted(i for i in self._samples if i < closing):
            start = self.origin + index * window
            samples = self._samples.pop(index)
            scored.append(score_window(start, start + window, samples, self.settings))
        self.closed = max(self.closed, closing)
        return scored
