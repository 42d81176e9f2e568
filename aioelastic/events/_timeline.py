"""A run's timeline from its event logs: lanes of spans and marks (pure), then a PNG.

:func:`build_timeline` turns the records of one or more ``--events-file`` logs into lanes: one
per node (rendezvous waits, restarts, membership changes, the end of the run) and one per
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
from dataclasses import dataclass, field
from typing import Any

from aioelastic.agent._events import (
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
    StopStepAgreed,
    WorkerFailed,
    WorkerReaped,
    WorkersStarted,
    WorkersStopped,
    WorkerSucceeded,
)
from aioelastic.events._jsonl import LoggedEvent
from aioelastic.rendezvous._info import NodeLost, RoundCompleted, RoundInvalidated, RoundJoining
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
    """``rendezvous`` or ``worker``."""
    label: str
    outcome: str = ""
    """For workers: ``succeeded``, ``failed``, ``stopped`` or ``running`` (log ended)."""


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
    running: dict[str, tuple[float, str]] = field(default_factory=dict)  # lane -> start, label
    lanes_of: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, pid) -> lane

    def lane(self, name: str) -> str:
        if name not in self.lanes:
            self.lanes.append(name)
        return name

    def end_worker(self, lane: str, when: float, outcome: str) -> None:
        started = self.running.pop(lane, None)
        if started is not None:
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
                self.lanes_of[(node, pid)] = lane
                self.end_worker(lane, when, "stopped")
                self.running[lane] = (when, f"pid {pid}, restart {data.get('restart_count', 0)}")
        elif kind == WorkerSucceeded.__name__:
            self.end_worker(self._worker_lane(node, data), when, "succeeded")
        elif kind == WorkerFailed.__name__:
            failure = data.get("failure", {})
            lane = self._worker_lane(node, failure)
            self.end_worker(lane, when, "failed")
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
                self.lanes_of[(node, pid)] = lane
                self.end_worker(lane, when, "stopped")
                self.running[lane] = (when, f"pid {pid}, gen {generation}")
                if replaced.get("by_spare"):
                    self.marks.append(Mark(lane, when, "spare", f"spare pid {pid} took the rank"))
        elif kind == GenerationFormed.__name__:
            since = data.get("since_failure")
            took = f" {since * 1000:.0f} ms after the failure" if isinstance(since, float) else ""
            label = f"gen {data.get('generation', '?')} formed{took}"
            self.marks.append(Mark(node_lane, when, "formed", label))
        elif kind == RecoveryFellBack.__name__:
            self.marks.append(Mark(node_lane, when, "restart", "in-place recovery fell back"))
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
    return Timeline(tuple(nodes + ranks), tuple(builder.spans), tuple(builder.marks), end)


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
    "preempted": ("s", "#9b2226"),
    "saved": ("o", "#ffb703"),
}


def _label_offsets(timeline: Timeline) -> list[tuple[Mark, int | None]]:
    """Each mark with how many label rows to raise its label (None: same label, just shown).

    Marks of one lane closer than 2% of the run share a crowd: their labels stack upwards and a
    label already shown in the crowd is not repeated.
    """
    near = timeline.duration / 50
    placed: list[tuple[Mark, int | None]] = []
    crowd: list[Mark] = []
    for mark in sorted(timeline.marks, key=lambda m: (m.lane, m.time)):
        if not crowd or crowd[-1].lane != mark.lane or mark.time - crowd[-1].time > near:
            crowd = []
        repeated = any(m.label == mark.label for m in crowd)
        placed.append((mark, None if repeated else len({m.label for m in crowd})))
        crowd.append(mark)
    return placed


def render_timeline(timeline: Timeline, path: str, *, title: str = "aioelastic run") -> None:
    """Draw ``timeline`` as a PNG at ``path`` (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = {lane: index for index, lane in enumerate(timeline.lanes)}
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 2))
    for span in timeline.spans:
        color = SPAN_COLORS["rendezvous" if span.kind == "rendezvous" else span.outcome]
        width = max(span.end - span.start, timeline.duration / 500 or 0.001)
        ax.barh(rows[span.lane], width, left=span.start, height=0.6, color=color)
    for mark, raise_by in _label_offsets(timeline):
        marker, color = MARK_STYLES[mark.kind]
        ax.plot(mark.time, rows[mark.lane], marker=marker, color=color, markersize=9)
        if raise_by is not None:
            ax.annotate(
                mark.label,
                (mark.time, rows[mark.lane]),
                xytext=(4, 8 + 8 * raise_by),
                textcoords="offset points",
                fontsize=7,
            )
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first event")
    ax.set_title(title)
    handles: list[Any] = [
        Patch(color=SPAN_COLORS["rendezvous"], label="rendezvous"),
        Patch(color=SPAN_COLORS["succeeded"], label="worker: succeeded"),
        Patch(color=SPAN_COLORS["failed"], label="worker: failed"),
        Patch(color=SPAN_COLORS["stopped"], label="worker: stopped"),
    ]
    handles += [
        Line2D([], [], marker=marker, color=color, linestyle="", label=kind)
        for kind, (marker, color) in MARK_STYLES.items()
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
