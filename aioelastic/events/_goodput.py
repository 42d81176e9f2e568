"""Goodput and badput from a job's event logs (pure: events in, a report out).

Theory of operation. The job's wall time runs from its first record to its last, over every
node's log. The records give three kinds of points on it: *step marks* (``StepsMarked``: when
each rank began each step, in which life of the job: restart count and generation),
*disruptions* (a worker failed, was reaped or evicted, a node was lost or fenced: failures; the
job stopped to admit new nodes: not one) and *checkpoint saves* the user marked. One scan in
time order cuts the wall time into bands, each of one category:

* **start-up**: from the first record to the first step mark (process start, imports, first
  rendezvous);
* **productive**: from the start of a step to the start of the next one, for a step the job
  had not reached before (``reached``: the highest step any rank began so far);
* **re-done**: the same for a step the job had already reached (it restarted from an older
  checkpoint), and the step a failure cut short (from its start to the failure);
* **recovery**: from a failure to the first step of a newer life (marks of the life the failure
  ended are ignored from the failure on): one per failure, the first failure of an incident
  opens it;
* **idle**: the same from a disruption that is no failure (nodes waiting to join);
* **checkpoint**: the marked saves, cut out of productive and re-done bands;
* **other**: the rest: after the last step (a step lasts at most the median step time; the
  remainder is shutdown), or everything when no step was marked.

The job begins a step when the last rank of its life (the ranks that marked any step in that
life) reached it, by beginning it or a later step: the job is where its slowest rank is, a rank
that resumed from a later checkpoint (ranks not in lockstep) is past the steps it skipped, and
a step that some rank never reached (it died first) is not a step of the job. Steps the job
reached at one instant are one step, the highest. The bands tile the wall time, so the
categories add up to it exactly; goodput is the productive share, badput each other category's
share.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aioelastic._kinds.agent import (
    MembershipChanged,
    NodeFenced,
    StepsMarked,
    StepTimes,
    WorkerEvicted,
    WorkerFailed,
    WorkerReaped,
    WorkerRestartedToLeave,
)
from aioelastic._kinds.rendezvous import NodeLost
from aioelastic.events._jsonl import LoggedEvent
from aioelastic.events._stragglers import (
    DEFAULT_FACTOR,
    DEFAULT_WINDOW,
    ScoredWindow,
    StragglerSettings,
    StragglerWatch,
)

PRODUCTIVE = "productive"
BADPUT = ("startup", "recovery", "redone", "checkpoint", "idle", "other")
"""The badput causes, in the order reports list them."""

FAILURES = frozenset(
    kind.__name__
    for kind in (WorkerFailed, WorkerReaped, WorkerEvicted, WorkerRestartedToLeave, NodeFenced)
)
IDLE_REASONS = frozenset({"NODES_WAITING"})
"""``MembershipChanged`` reasons that are no failure: the job stops to admit nodes."""

Life = tuple[int, int]
"""(restart count, generation): newer lives compare greater."""


@dataclass(frozen=True, slots=True)
class Band:
    """A stretch of wall time of one category (``productive`` or a badput cause)."""

    start: float
    end: float
    category: str
    life: Life | None
    """The life the band belongs to (a recovery: the life it leads to; None: none came)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Recovery:
    """One failure and the time until the job made a step again (None: it never did)."""

    cause: str
    node: str
    rank: int | None
    failed_at: float
    resumed_at: float | None
    seconds: float


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank named a straggler in ``windows`` windows; its lowest score and first naming."""

    rank: int
    windows: int
    first_named: float
    """The end of the first window that named it (Unix time)."""
    lowest_score: float


@dataclass(frozen=True, slots=True)
class GoodputReport:
    """What a job's time went to (see the module docstring); times are Unix seconds."""

    start: float
    end: float
    bands: tuple[Band, ...]
    recoveries: tuple[Recovery, ...] = ()
    steps_marked: int = 0
    last_step: int | None = None
    redone_steps: int = 0
    windows: tuple[ScoredWindow, ...] = ()
    factor: float = StragglerSettings().factor
    window: float = StragglerSettings().window

    @property
    def wall_seconds(self) -> float:
        return self.end - self.start

    def seconds(self, category: str) -> float:
        """Seconds of ``category`` (``productive`` or a badput cause)."""
        return sum(band.seconds for band in self.bands if band.category == category)

    @property
    def goodput(self) -> float:
        """Productive step time over the wall time (0 for an empty log)."""
        return _fraction(self.seconds(PRODUCTIVE), self.wall_seconds)

    @property
    def badput(self) -> dict[str, float]:
        """Each badput cause's share of the wall time."""
        return {cause: _fraction(self.seconds(cause), self.wall_seconds) for cause in BADPUT}

    @property
    def stragglers(self) -> tuple[Straggler, ...]:
        """The ranks any window named, by rank."""
        named: dict[int, Straggler] = {}
        for window in self.windows:
            scores = {r.rank: r.score for r in window.ranks}
            for rank in window.stragglers:
                seen = named.get(rank)
                if seen is None:
                    named[rank] = Straggler(rank, 1, window.end, scores[rank])
                else:
                    low = min(seen.lowest_score, scores[rank])
                    named[rank] = Straggler(rank, seen.windows + 1, seen.first_named, low)
        return tuple(named[rank] for rank in sorted(named))

    def rank_step_seconds(self) -> dict[int, float]:
        """Each rank's median step time over the windows (the median of its window medians)."""
        medians: dict[int, list[float]] = {}
        for window in self.windows:
            for ranked in window.ranks:
                medians.setdefault(ranked.rank, []).append(ranked.median)
        return {rank: statistics.median(values) for rank, values in sorted(medians.items())}

    def lives(self) -> list[dict[str, Any]]:
        """Each life's span and goodput: the bands that belong to it, in time order."""
        spans: dict[Life, list[Band]] = {}
        for band in self.bands:
            if band.life is not None:
                spans.setdefault(band.life, []).append(band)
        out = []
        for life, bands in spans.items():
            start, end = min(b.start for b in bands), max(b.end for b in bands)
            productive = sum(b.seconds for b in bands if b.category == PRODUCTIVE)
            out.append(
                {
                    "restart_count": life[0],
                    "generation": life[1],
                    "start": start,
                    "end": end,
                    "goodput": _fraction(productive, end - start),
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``aioelastic report --json`` object (documented in docs/guides/goodput.md)."""
        origin = self.start
        return {
            "version": 1,
            "start": self.start,
            "end": self.end,
            "wall_seconds": self.wall_seconds,
            "goodput": self.goodput,
            "productive_seconds": self.seconds(PRODUCTIVE),
            "badput": self.badput,
            "badput_seconds": {cause: self.seconds(cause) for cause in BADPUT},
            "recoveries": [
                {
                    "cause": r.cause,
                    "node": r.node,
                    "rank": r.rank,
                    "failed_at": r.failed_at - origin,
                    "resumed_at": None if r.resumed_at is None else r.resumed_at - origin,
                    "seconds": r.seconds,
                }
                for r in self.recoveries
            ],
            "steps": {
                "marked": self.steps_marked,
                "last": self.last_step,
                "redone": self.redone_steps,
            },
            "generations": [
                {**life, "start": life["start"] - origin, "end": life["end"] - origin}
                for life in self.lives()
            ],
            "stragglers": [
                {
                    "rank": s.rank,
                    "windows": s.windows,
                    "first_named": s.first_named - origin,
                    "lowest_score": s.lowest_score,
                }
                for s in self.stragglers
            ],
            "rank_step_seconds": {str(r): m for r, m in self.rank_step_seconds().items()},
            "straggler_window": {"seconds": self.window, "factor": self.factor},
            "bands": [
                {"start": b.start - origin, "end": b.end - origin, "category": b.category}
                for b in self.bands
            ],
        }


def _fraction(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole)) if whole > 0 else 0.0


# -- reading the records --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Mark:
    time: float
    step: int
    life: Life


@dataclass(frozen=True, slots=True)
class _Disruption:
    time: float
    cause: str
    node: str
    rank: int | None
    failure: bool


def _number(value: Any, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default


def _disruption(event: LoggedEvent) -> _Disruption | None:
    data = event.data
    if event.kind == WorkerFailed.__name__:
        failure = data.get("failure")
        failure = failure if isinstance(failure, Mapping) else {}
        when = _number(failure.get("timestamp"), event.time)
        rank = failure.get("rank")
        return _Disruption(min(when, event.time), event.kind, event.node, _rank(rank), True)
    if event.kind in FAILURES:
        return _Disruption(event.time, event.kind, event.node, _rank(data.get("rank")), True)
    if event.kind == NodeLost.__name__:
        return _Disruption(event.time, event.kind, event.node, None, True)
    if event.kind == MembershipChanged.__name__:
        idle = str(data.get("reason", "")) in IDLE_REASONS
        return _Disruption(event.time, event.kind, event.node, None, not idle)
    return None


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _marks(
    event: LoggedEvent,
) -> tuple[Life, int, list[_Mark], list[tuple[float, float]], tuple[tuple[int, float], ...]] | None:
    """A ``StepsMarked`` record's life, rank, marks and saves (None: not one, or malformed)."""
    if event.kind != StepsMarked.__name__:
        return None
    data = event.data
    try:
        life = (int(data["restart_count"]), int(data["generation"]))
        rank = int(data["rank"])
        marks = [
            _Mark(float(t), int(s), life) for s, t in zip(data["steps"], data["times"], strict=True)
        ]
        saves = [(float(a), float(b)) for a, b in data.get("saves", ())]
        done = tuple((int(s), float(t)) for s, t in data.get("done", ()))
    except (KeyError, TypeError, ValueError):
        return None
    return life, rank, marks, saves, done


# -- the scan -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Scan:
    """The scan's state: the band open since ``open_start``, the job's current life and step,
    the highest step it reached, and the failure a recovery waits to resolve."""

    bands: list[Band] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    open_start: float = 0.0
    open_category: str = "startup"
    open_life: Life | None = None
    life: Life | None = None
    dead: Life | None = None
    step: int | None = None
    reached: int | None = None
    redone: int = 0
    pending: list[int] = field(default_factory=list)
    """Indices of bands (and the open recovery) whose life is the next one to come."""
    recovering: _Disruption | None = None

    def close(self, when: float) -> None:
        """End the open band at ``when`` (an empty one leaves no band)."""
        when = max(when, self.open_start)
        if when > self.open_start:
            index = len(self.bands)
            self.bands.append(Band(self.open_start, when, self.open_category, self.open_life))
            if self.open_life is None:
                self.pending.append(index)
        self.open_start = when

    def adopt(self, life: Life) -> None:
        """The bands waiting for the next life (start-up, recovery) belong to ``life``."""
        for index in self.pending:
            band = self.bands[index]
            self.bands[index] = Band(band.start, band.end, band.category, life)
        self.pending.clear()

    def mark(self, mark: _Mark) -> float | None:
        """Take a mark; return the duration of the step it ends, if it ends one of its life."""
        if self.dead is not None and mark.life <= self.dead:
            return None  # a life a disruption ended
        if self.life is not None and mark.life < self.life:
            return None
        if self.life == mark.life and self.step is not None and mark.step <= self.step:
            return None  # another rank's mark of a step the job already began
        ended = None
        if self.open_category in (PRODUCTIVE, "redone") and self.life == mark.life:
            ended = mark.time - self.open_start
        self.close(mark.time)
        self.adopt(mark.life)
        if self.recovering is not None:
            failed = self.recovering
            self.recoveries.append(
                Recovery(
                    failed.cause,
                    failed.node,
                    failed.rank,
                    failed.time,
                    mark.time,
                    mark.time - failed.time,
                )
            )
            self.recovering = None
        fresh = self.reached is None or mark.step > self.reached
        if not fresh:
            self.redone += 1
        self.open_category = PRODUCTIVE if fresh else "redone"
        self.open_life = self.life = mark.life
        self.step = mark.step
        self.reached = mark.step if self.reached is None else max(self.reached, mark.step)
        return ended

    def disrupt(self, what: _Disruption) -> None:
        """A failure (or a stop to admit nodes): the current life is over."""
        if self.open_category in ("recovery", "idle"):
            return  # the first disruption of an incident names it
        if self.open_category in (PRODUCTIVE, "redone"):
            self.open_category = "redone"  # the step it cut short is lost
        self.close(what.time)
        self.dead = self.life
        self.step = None
        self.open_category = "recovery" if what.failure else "idle"
        self.open_life = None
        if what.failure:
            self.recovering = what

    def finish(self, end: float, typical: float | None) -> None:
        """Close the last band at ``end`` (a last step lasts at most ``typical``)."""
        if self.open_category in (PRODUCTIVE, "redone") and typical is not None:
            self.close(min(end, self.open_start + typical))
            self.open_category = "other"
        if self.open_category == "startup" and self.life is None:
            self.open_category = "other"  # no step was ever marked
        self.close(end)
        if self.recovering is not None:  # the job never made a step again
            failed = self.recovering
            self.recoveries.append(
                Recovery(
                    failed.cause, failed.node, failed.rank, failed.time, None, end - failed.time
                )
            )


def _merged(bands: list[Band]) -> list[Band]:
    """Join neighbouring bands of one category and life."""
    out: list[Band] = []
    for band in bands:
        last = out[-1] if out else None
        if last and (last.category, last.life, last.end) == (band.category, band.life, band.start):
            out[-1] = Band(last.start, band.end, band.category, band.life)
        else:
            out.append(band)
    return out


def _carve(bands: list[Band], saves: list[tuple[float, float]]) -> list[Band]:
    """Cut the checkpoint saves out of the productive and re-done bands."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(saves):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    if not merged:
        return bands
    out: list[Band] = []
    for band in bands:
        if band.category not in (PRODUCTIVE, "redone"):
            out.append(band)
            continue
        cursor = band.start
        for a, b in merged:
            a, b = max(a, band.start), min(b, band.end)
            if b <= a or b <= cursor:
                continue
            a = max(a, cursor)
            if a > cursor:
                out.append(Band(cursor, a, band.category, band.life))
            out.append(Band(a, b, "checkpoint", band.life))
            cursor = b
        if band.end > cursor or cursor == band.start:
            out.append(Band(cursor, band.end, band.category, band.life))
    return out


def goodput_report(
    events: Iterable[LoggedEvent], *, stragglers: StragglerSettings | None = None
) -> GoodputReport:
    """The goodput report of the job recorded in ``events`` (any order, any nodes)."""
    records = sorted(events, key=lambda e: e.time)
    if not records:
        return GoodputReport(0.0, 0.0, ())
    start, end = records[0].time, records[-1].time
    settings = stragglers or StragglerSettings()
    watch = StragglerWatch(settings)
    windows: list[ScoredWindow] = []
    points: list[tuple[float, int, _Mark | _Disruption]] = []
    saves: list[tuple[float, float]] = []
    marked = 0
    batches = []
    begun: dict[Life, dict[int, list[tuple[float, int]]]] = {}  # life -> rank -> (time, step)
    for event in records:
        found = _marks(event)
        if found is not None:
            life, rank, marks, saved, done = found
            marked += len(marks)
            saves += saved
            begun.setdefault(life, {}).setdefault(rank, []).extend((m.time, m.step) for m in marks)
            steps = tuple(m.step for m in marks)
            times = tuple(m.time for m in marks)
            batches.append((min(times, default=event.time), life, rank, steps, times, done))
            continue
        disruption = _disruption(event)
        if disruption is not None:
            points.append((_clamp(disruption.time, start, end), 0, disruption))
    for life, by_rank in begun.items():
        for when, step in _job_steps(by_rank.values()).items():
            points.append((_clamp(when, start, end), 1, _Mark(0.0, step, life)))
    for _, life, rank, steps, times, done in sorted(batches, key=lambda b: b[0]):
        windows += watch.feed(life, rank, steps, times, done)
    windows += watch.finish()
    scan = _Scan(open_start=start)
    durations: list[float] = []
    for when, _, point in sorted(points, key=_order):
        if isinstance(point, _Mark):
            ended = scan.mark(_Mark(when, point.step, point.life))
            if ended is not None:
                durations.append(ended)
        else:
            scan.disrupt(_Disruption(when, point.cause, point.node, point.rank, point.failure))
    typical = statistics.median(durations) if durations else None
    scan.finish(end, typical)
    return GoodputReport(
        start,
        end,
        tuple(
            _merged(
                _carve(
                    scan.bands, [(_clamp(a, start, end), _clamp(b, start, end)) for a, b in saves]
                )
            )
        ),
        tuple(scan.recoveries),
        marked,
        scan.reached,
        scan.redone,
        tuple(windows),
        settings.factor,
        settings.window,
    )


def _job_steps(ranks: Iterable[list[tuple[float, int]]]) -> dict[float, int]:
    """When one life's job began its steps (time -> step), from each rank's (time, step)
    marks: when its last rank reached the step (began it or a later one); of the steps it
    reached at one time, the highest."""
    reached: list[tuple[list[int], list[float]]] = []  # per rank: each new highest step, when
    for marks in ranks:
        highest: list[int] = []
        times: list[float] = []
        for when, step in sorted(marks):
            if not highest or step > highest[-1]:
                highest.append(step)
                times.append(when)
        reached.append((highest, times))
    began: dict[float, int] = {}
    for step in sorted({step for highest, _ in reached for step in highest}):
        found = [bisect_left(highest, step) for highest, _ in reached]
        if all(i < len(highest) for i, (highest, _) in zip(found, reached, strict=True)):
            when = max(times[i] for i, (_, times) in zip(found, reached, strict=True))
            began[when] = max(began.get(when, step), step)
    return began


def _order(point: tuple[float, int, _Mark | _Disruption]) -> tuple[Any, ...]:
    """Time order, disruptions first at one time (failures before the rest): a total order,
    so logs read in any order give one report."""
    when, kind, what = point
    if isinstance(what, _Mark):
        return (when, kind, what.life, what.step)
    return (when, kind, not what.failure, what.cause, what.node, what.rank or 0)


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def run_settings(events: Iterable[LoggedEvent]) -> tuple[float, float]:
    """The straggler window and factor the run used (its agents' ``StepTimes``), else the
    defaults."""
    for event in events:
        if event.kind == StepTimes.__name__:
            start, end = event.data.get("start"), event.data.get("end")
            factor = event.data.get("factor")
            if isinstance(start, float | int) and isinstance(end, float | int) and end > start:
                window = float(end) - float(start)
                if isinstance(factor, float | int) and factor > 1:
                    return window, float(factor)
                return window, DEFAULT_FACTOR
    return DEFAULT_WINDOW, DEFAULT_FACTOR
