"""A run's timeline from its event logs: lanes of spans and marks (pure), then a PNG.

:func:`build_timeline` turns the records of one or more ``--events-file`` logs into lanes: one
per node (rendezvous waits, restarts, membership changes, the end of the run) and one per
worker rank (its lifetimes, failures and watchdog reaps). Under in-place recovery the node lane
marks each generation (assigned, formed) and a rank's lane starts a new life where a spare or
a new process took it. It does no I/O and reads no clock;
times are seconds since the first record. Where workers marked their steps (``world.step``), a
``goodput`` lane on top shows what each stretch of the job's time went to (productive, start-up,
recovery, re-done, checkpoint, idle, other: ``_goodput.py``), labelled with each generation's
goodput, and a straggler mark shows where a rank was first named one. :func:`render_timeline`
draws it with matplotlib (the optional extra ``aioelastic[timeline]``).

worker rank (its lifetimes, failures and watchdog reaps). A preemption marks the node lane
(noticed, the stop step, a rank that reached no step boundary) and each rank's save. Under
in-place recovery the node lane marks each generation (assigned, formed) and a rank's lane
starts a new life where a spare or a new process took it. It does no I/O and reads no clock;
times are seconds since the first record. :func:`render_timeline` draws it with matplotlib
(the optional extra ``aioelastic[timeline]``).

Records read back from a log carry their kind as the event class's name; this module names each
kind through its class, so it knows every part's events and sits above them (``import
aioelastic.events`` does not load it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aioelastic._kinds.agent import (
    GenerationAssigned,
    GenerationFormed,
    GroupRestarting,
    MembershipChanged,
    PreemptionEnded,
    PreemptionNoticed,
    RankSaved,
    RecoveryFellBack,
    RendezvousCompleted,
    RendezvousJoining,
    RunFinished,
    ShutdownRequested,
    SpareStarted,
    StepsMarked,
    StopStepAgreed,
    StragglerDetected,
    WorkerFailed,
    WorkerReaped,
    WorkersStarted,
    WorkersStopped,
    WorkerSucceeded,
)
from aioelastic._kinds.rendezvous import NodeLost, RoundCompleted, RoundInvalidated, RoundJoining
from aioelastic.events._goodput import goodput_report
from aioelastic.events._jsonl import LoggedEvent
from aioelastic.timer._events import TimerReaped


def _names(*kinds: type) -> frozenset[str]:
    return frozenset(kind.__name__ for kind in kinds)


RENDEZVOUS_STARTS = _names(RendezvousJoining, RoundJoining, GroupRestarting, MembershipChanged)
RENDEZVOUS_ENDS = _names(RendezvousCompleted, RoundCompleted)
REAPS = _names(WorkerReaped, TimerReaped)
MEMBERSHIP_MARKS = _names(MembershipChanged, RoundInvalidated, NodeLost)


@dataclass(frozen=True, slots=True)
class Span:
    """Something that lasted: a rendezvous wait on a node lane, a worker's life on a rank lane."""

    lane: str
    start: float
    end: float
    kind: str
    """``rendezvous``, ``worker`` or ``goodput``."""
    label: str
    outcome: str = ""
    """For workers: ``succeeded``, ``failed``, ``stopped`` or ``running`` (log ended); for
    goodput: the band's category."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Something that happened at one time: ``failed``, ``reaped``, ``restart``, ...."""

    lane: str
    time: float
    kind: str
    label: str


@dataclass(frozen=True, slots=True)
class Timeline:
    """Lanes in display order, and what happened on them; times from the first record."""

    lanes: tuple[str, ...]
    spans: tuple[Span, ...]
    marks: tuple[Mark, ...]
    duration: float


@dataclass(slots=True)
class _Builder:
    origin: float
    lanes: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    waiting: dict[str, float] = field(default_factory=dict)  # node -> rendezvous start
    # lane -> start, label, pid of the life running on it
    running: dict[str, tuple[float, str, Any]] = field(default_factory=dict)
    lanes_of: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, pid) -> lane
    ended: dict[tuple[str, Any], int] = field(default_factory=dict)  # (lane, pid) -> its span

    def lane(self, name: str) -> str:
        if name not in self.lanes:
            self.lanes.append(name)
        return name

    def start_worker(self, node: str, lane: str, when: float, pid: Any, label: str) -> None:
        self.lanes_of[(node, pid)] = lane
        self.running[lane] = (when, label, pid)

    def end_worker(self, lane: str, when: float, outcome: str, pid: Any = None) -> None:
        """End the life running on ``lane`` (``pid``'s, when given: if its rank already went to
        a replacement, the life that ended then is given ``outcome``)."""
        started = self.running.get(lane)
        if pid is not None and (started is None or started[2] != pid):
            index = self.ended.get((lane, pid))
            if index is not None:
                self.spans[index] = replace(self.spans[index], outcome=outcome)
            return
        if started is not None:
            del self.running[lane]
            self.ended[(lane, started[2])] = len(self.spans)
            self.spans.append(Span(lane, started[0], when, "worker", started[1], outcome))

    def feed(self, event: LoggedEvent) -> None:
        when, node, kind, data = event.time - self.origin, event.node, event.kind, event.data
        first = node not in self.lanes  # a node's first record opens its first rendezvous
        node_lane = self.lane(node)
        if kind in RENDEZVOUS_STARTS or first:
            self.waiting.setdefault(node, when)
        if kind in RENDEZVOUS_ENDS:
            if node in self.waiting:  # the handler's and the agent's completion: one span
                start = self.waiting.pop(node)
                label = _round_label(data)
                self.spans.append(Span(node_lane, start, when, "rendezvous", label))
        elif kind == WorkersStarted.__name__:
            for rank, pid in zip(data.get("ranks", ()), data.get("pids", ()), strict=False):
                lane = self.lane(f"rank {rank} ({node})")
                self.end_worker(lane, when, "stopped")
                label = f"pid {pid}, restart {data.get('restart_count', 0)}"
                self.start_worker(node, lane, when, pid, label)
        elif kind == WorkerSucceeded.__name__:
            lane = self._worker_lane(node, data)
            self.end_worker(lane, when, "succeeded", data.get("pid"))
        elif kind == WorkerFailed.__name__:
            failure = data.get("failure", {})
            lane = self._worker_lane(node, failure)
            self.end_worker(lane, when, "failed", failure.get("pid"))
            self.marks.append(Mark(lane, when, "failed", f"exit {failure.get('returncode', '?')}"))
        elif kind in REAPS:
            lane = self._worker_lane(node, data)
            self.marks.append(Mark(lane, when, "reaped", f"scope {data.get('scope_id', '?')}"))
        elif kind == WorkersStopped.__name__:
            for lane in [lane for lane in self.running if lane.endswith(f"({node})")]:
                self.end_worker(lane, when, "stopped")
        elif kind == GroupRestarting.__name__:
            restart = f"restart {data.get('restart_count', '?')}/{data.get('max_restarts', '?')}"
            self.marks.append(Mark(node_lane, when, "restart", restart))
        elif kind in MEMBERSHIP_MARKS:
            reason = str(data.get("reason", kind)).lower()
            if kind == NodeLost.__name__:
                reason = f"reported node {data.get('lost', '?')} lost"
            self.marks.append(Mark(node_lane, when, "membership", reason))
        elif kind == SpareStarted.__name__:
            self.marks.append(
                Mark(self.lane(f"spares ({node})"), when, "spare", f"pid {data.get('pid')}")
            )
        elif kind == GenerationAssigned.__name__:
            generation = data.get("generation", "?")
            label = f"gen {generation}: {data.get('reason', '?')}"
            self.marks.append(Mark(node_lane, when, "generation", label))
            for replaced in data.get("replaced", ()):
                pid = replaced.get("pid")
                lane = self.lane(f"rank {replaced.get('rank', '?')} ({node})")
                # the rank's holder failed, hung or was lost: its life ends as a failure (its
                # WorkerFailed, reported after the survivors were told, comes later)
                gone = replaced.get("failed_pid") is not None
                self.end_worker(lane, when, "failed" if gone else "stopped")
                self.start_worker(node, lane, when, pid, f"pid {pid}, gen {generation}")
                if replaced.get("by_spare"):
                    self.marks.append(Mark(lane, when, "spare", f"spare pid {pid} took the rank"))
        elif kind == GenerationFormed.__name__:
            since = data.get("since_failure")
            took = f" {since * 1000:.0f} ms after the failure" if isinstance(since, float) else ""
            label = f"gen {data.get('generation', '?')} formed{took}"
            self.marks.append(Mark(node_lane, when, "formed", label))
        elif kind == RecoveryFellBack.__name__:
            self.marks.append(Mark(node_lane, when, "restart", "in-place recovery fell back"))
        elif kind == StragglerDetected.__name__:
            lane = self.lane(f"rank {data.get('rank', '?')} ({node})")
            score = data.get("score")
            shown = f" (score {score:.2f})" if isinstance(score, float) else ""
            self.marks.append(Mark(lane, when, "straggler", f"straggler{shown}"))
        elif kind == ShutdownRequested.__name__:
            self.marks.append(Mark(node_lane, when, "shutdown", f"signal {data.get('signal')}"))
        elif kind == PreemptionNoticed.__name__:
            label = f"preempted by node {data.get('by_node', '?')} ({data.get('source', '?')})"
            self.marks.append(Mark(node_lane, when, "preempted", label))
        elif kind == StopStepAgreed.__name__:
            label = f"stop at step {data.get('step', '?')}"
            self.marks.append(Mark(node_lane, when, "preempted", label))
        elif kind == RankSaved.__name__:
            lane = self._worker_lane(node, data)
            self.marks.append(Mark(lane, when, "saved", f"saved at step {data.get('step', '?')}"))
        elif kind == PreemptionEnded.__name__:
            missing = data.get("no_boundary") or []
            if missing:
                ranks = ", ".join(map(str, missing))
                label = f"rank {ranks}: no step boundary before the deadline"
                self.marks.append(Mark(node_lane, when, "preempted", label))
        elif kind == RunFinished.__name__:
            result = data.get("result", {})
            self.marks.append(Mark(node_lane, when, "finished", str(result.get("state", "?"))))
            for lane in [lane for lane in self.running if lane.endswith(f"({node})")]:
                self.end_worker(lane, when, "stopped")

    def _worker_lane(self, node: str, data: Mapping[str, Any]) -> str:
        pid = data.get("pid")
        if isinstance(pid, int) and (node, pid) in self.lanes_of:
            return self.lanes_of[(node, pid)]
        return self.lane(f"rank {data.get('rank', '?')} ({node})")


def _round_label(data: Mapping[str, Any]) -> str:
    rank = data.get("group_rank", data.get("rank", "?"))
    size = data.get("group_world_size", data.get("world_size", "?"))
    round_ = data.get("round")
    prefix = f"round {round_}: " if round_ is not None else ""
    return f"{prefix}node rank {rank} of {size}"


def build_timeline(events: Iterable[LoggedEvent]) -> Timeline:
    """Lanes, spans and marks of the run recorded in ``events`` (any order, any nodes)."""
    ordered = sorted(events, key=lambda e: e.time)
    if not ordered:
        return Timeline((), (), (), 0.0)
    builder = _Builder(ordered[0].time)
    for event in ordered:
        builder.feed(event)
    end = ordered[-1].time - builder.origin
    for lane in list(builder.running):
        builder.end_worker(lane, end, "running")
    for node, start in builder.waiting.items():
        builder.spans.append(Span(node, start, end, "rendezvous", "waiting (log ended)"))
    nodes = [lane for lane in builder.lanes if not lane.startswith("rank ")]
    ranks = sorted((lane for lane in builder.lanes if lane.startswith("rank ")), key=_rank_order)
    if any(event.kind == StepsMarked.__name__ for event in ordered):
        nodes.insert(0, GOODPUT_LANE)
        _add_goodput(builder, ordered)
    return Timeline(tuple(nodes + ranks), tuple(builder.spans), tuple(builder.marks), end)


GOODPUT_LANE = "goodput"


def _add_goodput(builder: _Builder, events: list[LoggedEvent]) -> None:
    """The goodput lane: a span per band, a label per generation with its goodput."""
    report = goodput_report(events)
    origin = builder.origin
    for band in report.bands:
        builder.spans.append(
            Span(
                GOODPUT_LANE,
                band.start - origin,
                band.end - origin,
                "goodput",
                band.category,
                band.category,
            )
        )
    lives = report.lives()
    restart_mode = all(life["generation"] == life["restart_count"] + 1 for life in lives)
    for life in lives:
        name = f"restart {life['restart_count']}" if restart_mode else f"gen {life['generation']}"
        label = f"{name}: {life['goodput']:.0%} goodput"
        builder.marks.append(Mark(GOODPUT_LANE, life["start"] - origin, "life", label))


def _rank_order(lane: str) -> tuple[int, str]:
    number = lane.split()[1]
    return (int(number) if number.lstrip("-").isdigit() else 1 << 30, lane)


SPAN_COLORS = {
    "rendezvous": "#8ecae6",
    "succeeded": "#2a9d8f",
    "failed": "#e76f51",
    "stopped": "#adb5bd",
    "running": "#90be6d",
}
BAND_COLORS = {
    "productive": "#38b000",
    "startup": "#3a0ca3",
    "recovery": "#d00000",
    "redone": "#ff9f1c",
    "checkpoint": "#b5179e",
    "idle": "#ffd60a",
    "other": "#6c757d",
}
"""The goodput lane's colours, by category."""
MARK_STYLES = {
    "failed": ("X", "#d62828"),
    "reaped": ("v", "#f77f00"),
    "restart": ("|", "#6a4c93"),
    "membership": ("D", "#3a86ff"),
    "shutdown": ("s", "#000000"),
    "finished": ("*", "#000000"),
    "generation": ("^", "#2a9d8f"),
    "formed": ("o", "#2a9d8f"),
    "spare": ("P", "#90be6d"),
    "straggler": ("<", "#9d0208"),
    "life": ("|", "#000000"),
    "preempted": ("s", "#9b2226"),
    "saved": ("o", "#ffb703"),
}


LABEL_POINTS_PER_CHAR = 4.6
"""The width of one character of a mark's label (7 pt sans-serif), in points, rounded up."""
PLOT_WIDTH_POINTS = 650.0
"""The width of the drawn time axis, in points (a 12 inch figure less its margins and legend)."""


@dataclass(frozen=True, slots=True)
class LabelPlace:
    """Where a mark's label goes: ``row`` rows above the lane (None: not shown, the same label
    is shown next to it), right of the mark or, near the end of the run, left of it."""

    mark: Mark
    row: int | None
    leftward: bool = False


def place_labels(timeline: Timeline, *, plot_width: float = PLOT_WIDTH_POINTS) -> list[LabelPlace]:
    """Each mark's label place: on its lane, a label goes on the lowest row where it overlaps no
    label placed before it, so labels stack instead of overwriting each other; one that would
    pass the end of the run is written leftwards, so the last is not clipped; a label already
    shown among the marks it overlaps is not repeated."""
    duration = timeline.duration or 1.0
    seconds_per_char = LABEL_POINTS_PER_CHAR * duration / plot_width
    placed: list[LabelPlace] = []
    rows: dict[str, list[list[tuple[float, float, str]]]] = {}  # lane -> row -> labels drawn
    for mark in sorted(timeline.marks, key=lambda m: (m.lane, m.time)):
        width = (len(mark.label) + 1) * seconds_per_char
        leftward = mark.time + width > duration and mark.time > duration - mark.time
        start, end = (mark.time - width, mark.time) if leftward else (mark.time, mark.time + width)
        lane_rows = rows.setdefault(mark.lane, [])
        near = [
            label for row in lane_rows for label in row if label[0] <= end and label[1] >= start
        ]
        if any(label == mark.label for _, _, label in near):
            placed.append(LabelPlace(mark, None, leftward))
            continue
        free = next(
            (i for i, row in enumerate(lane_rows) if all(e < start or s > end for s, e, _ in row)),
            len(lane_rows),
        )
        if free == len(lane_rows):
            lane_rows.append([])
        lane_rows[free].append((start, end, mark.label))
        placed.append(LabelPlace(mark, free, leftward))
    return placed


def render_timeline(timeline: Timeline, path: str, *, title: str = "aioelastic run") -> None:
    """Draw ``timeline`` as a PNG at ``path`` (needs matplotlib)."""
    import matplotlib.pyplot as plt

    fig = draw_timeline(timeline, title=title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_timeline(timeline: Timeline, *, title: str = "aioelastic run") -> Any:
    """Draw ``timeline`` on a new matplotlib figure and return it (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = {lane: index for index, lane in enumerate(timeline.lanes)}
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 2))
    for span in timeline.spans:
        if span.kind == "goodput":
            color = BAND_COLORS.get(span.outcome, BAND_COLORS["other"])
        else:
            color = SPAN_COLORS["rendezvous" if span.kind == "rendezvous" else span.outcome]
        width = max(span.end - span.start, timeline.duration / 500 or 0.001)
        ax.barh(rows[span.lane], width, left=span.start, height=0.6, color=color)
    places = place_labels(timeline)
    for place in places:
        mark = place.mark
        marker, color = MARK_STYLES[mark.kind]
        ax.plot(mark.time, rows[mark.lane], marker=marker, color=color, markersize=9)
        if place.row is not None:
            ax.annotate(
                mark.label,
                (mark.time, rows[mark.lane]),
                xytext=(-4 if place.leftward else 4, 8 + 8 * place.row),
                textcoords="offset points",
                fontsize=7,
                horizontalalignment="right" if place.leftward else "left",
            )
    # room above the first lane for its stacked labels (a lane is 36 points high)
    top = max((p.row for p in places if p.row is not None and rows[p.mark.lane] == 0), default=-1)
    ax.set_ylim(len(rows) - 0.5, -0.6 - (16 + 8 * top) / 36 if top >= 0 else -0.5)
    ax.set_xlim(-0.01 * (timeline.duration or 1.0), 1.01 * (timeline.duration or 1.0))
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.set_xlabel("seconds since the first event")
    ax.set_title(title)
    handles: list[Any] = [
        Patch(color=SPAN_COLORS["rendezvous"], label="rendezvous"),
        Patch(color=SPAN_COLORS["succeeded"], label="worker: succeeded"),
        Patch(color=SPAN_COLORS["failed"], label="worker: failed"),
        Patch(color=SPAN_COLORS["stopped"], label="worker: stopped"),
    ]
    shown = {span.outcome for span in timeline.spans if span.kind == "goodput"}
    handles += [
        Patch(color=color, label="goodput" if category == "productive" else f"badput: {category}")
        for category, color in BAND_COLORS.items()
        if category in shown
    ]
    handles += [
        Line2D([], [], marker=marker, color=color, linestyle="", label=kind)
        for kind, (marker, color) in MARK_STYLES.items()
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
