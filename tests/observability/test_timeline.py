"""The run timeline: lanes built from event records (pure), drawn as a PNG."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.events import LoggedEvent
from aioelastic.events._timeline import Mark, Span, build_timeline, render_timeline


def ev(time: float, kind: str, node: str = "a", **data: Any) -> LoggedEvent:
    return LoggedEvent(time, node, "agent", kind, data)


RUN = [
    ev(100.0, "RendezvousCompleted", group_rank=0, group_world_size=1, world_size=2),
    ev(100.5, "WorkersStarted", restart_count=0, ranks=[0, 1], pids=[10, 11]),
    ev(101.0, "WorkerReaped", local_rank=1, rank=1, pid=11, scope_id="step", signal=9),
    ev(
        101.1,
        "WorkerFailed",
        failure={"local_rank": 1, "rank": 1, "pid": 11, "returncode": -9},
    ),
    ev(101.2, "WorkersStopped", reason="failure", signal=15, killed=0),
    ev(101.3, "GroupRestarting", restart_count=1, max_restarts=1),
    ev(101.5, "RendezvousCompleted", group_rank=0, group_world_size=1, world_size=2),
    ev(101.6, "WorkersStarted", restart_count=1, ranks=[0, 1], pids=[20, 21]),
    ev(102.0, "WorkerSucceeded", local_rank=0, rank=0, pid=20),
    ev(102.1, "WorkerSucceeded", local_rank=1, rank=1, pid=21),
    ev(102.2, "RunFinished", result={"state": "succeeded"}),
]


def test_a_reaped_and_restarted_run_has_node_and_rank_lanes() -> None:
    """One lane for the node, one per rank; a reap and a failure mark rank 1's first life."""
    timeline = build_timeline(RUN)
    assert timeline.lanes == ("a", "rank 0 (a)", "rank 1 (a)")
    assert timeline.duration == pytest.approx(2.2)
    workers = [s for s in timeline.spans if s.kind == "worker"]
    assert [(s.lane, s.outcome) for s in workers] == [
        ("rank 1 (a)", "failed"),
        ("rank 0 (a)", "stopped"),
        ("rank 0 (a)", "succeeded"),
        ("rank 1 (a)", "succeeded"),
    ]
    assert [(m.lane, m.kind) for m in timeline.marks] == [
        ("rank 1 (a)", "reaped"),
        ("rank 1 (a)", "failed"),
        ("a", "restart"),
        ("a", "finished"),
    ]


def test_rendezvous_waits_run_from_the_restart_to_the_next_round() -> None:
    """The second rendezvous span starts at GroupRestarting and ends at the completion."""
    spans = [s for s in build_timeline(RUN).spans if s.kind == "rendezvous"]
    assert [(round(s.start, 3), round(s.end, 3)) for s in spans] == [(0.0, 0.0), (1.3, 1.5)]


def test_nodes_from_several_logs_share_one_time_axis_in_any_order() -> None:
    """Records of two nodes, given out of order, are sorted; each node gets its lanes."""
    events = [
        ev(5.0, "WorkersStarted", node="b", restart_count=0, ranks=[1], pids=[7]),
        ev(4.0, "RendezvousCompleted", node="b", group_rank=1, group_world_size=2),
        ev(3.0, "RendezvousCompleted", node="a", group_rank=0, group_world_size=2),
        ev(4.5, "WorkersStarted", node="a", restart_count=0, ranks=[0], pids=[7]),
    ]
    timeline = build_timeline(events)
    assert timeline.lanes == ("a", "b", "rank 0 (a)", "rank 1 (b)")
    running = [s for s in timeline.spans if s.kind == "worker"]
    assert {(s.lane, s.start, s.outcome) for s in running} == {
        ("rank 0 (a)", 1.5, "running"),
        ("rank 1 (b)", 2.0, "running"),
    }


def test_a_log_that_ends_while_waiting_shows_the_wait_open() -> None:
    """A node still in rendezvous when its log ends gets a span to the end, labelled so."""
    timeline = build_timeline(
        [ev(0.0, "RunStarted"), ev(3.0, "MembershipChanged", reason="NODES_WAITING")]
    )
    assert Span("a", 0.0, 3.0, "rendezvous", "waiting (log ended)") in timeline.spans
    assert Mark("a", 3.0, "membership", "nodes_waiting") in timeline.marks


def test_no_events_is_an_empty_timeline() -> None:
    """Nothing recorded: no lanes, no duration."""
    assert build_timeline([]).lanes == ()


def test_the_timeline_renders_to_a_png(tmp_path: Path) -> None:
    """render_timeline writes a PNG file."""
    pytest.importorskip("matplotlib", reason="needs the timeline extra (matplotlib)")
    path = tmp_path / "timeline.png"
    render_timeline(build_timeline(RUN), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_handlers_and_the_agents_completions_make_one_span() -> None:
    """RoundCompleted then RendezvousCompleted of one round draw a single rendezvous span."""
    timeline = build_timeline(
        [
            LoggedEvent(0.0, "a", "agent", "RendezvousJoining", {}),
            LoggedEvent(1.0, "a", "rendezvous", "RoundCompleted", {"round": 1, "rank": 0}),
            LoggedEvent(1.0, "a", "agent", "RendezvousCompleted", {"group_rank": 0}),
        ]
    )
    assert [(s.start, s.end) for s in timeline.spans] == [(0.0, 1.0)]


def test_labels_of_one_incident_stack_and_do_not_repeat() -> None:
    """Marks of one lane at nearly one time raise their labels; a repeated label is not shown."""
    from aioelastic.events._timeline import place_labels

    timeline = build_timeline(
        [
            ev(0.0, "RendezvousCompleted", group_rank=0, group_world_size=2),
            ev(5.0, "NodeLost", round=1, lost=2),
            ev(5.0, "RoundInvalidated", reason="participant_lost"),
            ev(5.0, "MembershipChanged", reason="PARTICIPANT_LOST"),
            ev(10.0, "RunFinished", result={"state": "succeeded"}),
        ]
    )
    offsets = [(place.mark.label, place.row) for place in place_labels(timeline)]
    assert offsets == [
        ("reported node 2 lost", 0),
        ("participant_lost", 1),
        ("participant_lost", None),
        ("succeeded", 0),
    ]


@pytest.mark.parametrize("failure_at", [101.0, 101.01], ids=["reported-first", "reported-after"])
def test_in_place_recovery_draws_generations_and_the_spare_taking_the_rank(
    failure_at: float,
) -> None:
    """A spare takes rank 1: the rank's lane gets a second life, the killed worker's drawn as
    failed, whether its failure is logged before or (as the agent does) after the new
    generation; the node lane marks gen 2."""
    run = [
        ev(100.0, "RendezvousCompleted", group_rank=0, group_world_size=1, world_size=2),
        ev(100.1, "SpareStarted", pid=12),
        ev(100.1, "WorkersStarted", restart_count=0, ranks=[0, 1], pids=[10, 11]),
        ev(
            failure_at,
            "WorkerFailed",
            failure={"local_rank": 1, "rank": 1, "pid": 11, "returncode": -9},
        ),
        ev(
            101.0,
            "GenerationAssigned",
            generation=2,
            world_size=2,
            reason="rank 1 failed",
            pids=[10, 12],
            replaced=[{"rank": 1, "local_rank": 1, "failed_pid": 11, "pid": 12, "by_spare": True}],
        ),
        ev(101.05, "GenerationFormed", generation=2, world_size=2, reason="", since_failure=0.05),
        ev(102.0, "WorkerSucceeded", local_rank=0, rank=0, pid=10),
        ev(102.0, "WorkerSucceeded", local_rank=0, rank=1, pid=12),
    ]
    timeline = build_timeline(run)
    assert timeline.lanes == ("a", "spares (a)", "rank 0 (a)", "rank 1 (a)")
    rank1 = [(s.label, s.outcome, s.end) for s in timeline.spans if s.lane == "rank 1 (a)"]
    assert rank1 == [
        ("pid 11, restart 0", "failed", pytest.approx(1.0)),
        ("pid 12, gen 2", "succeeded", pytest.approx(2.0)),
    ]
    kinds = [(m.lane, m.kind, m.label) for m in timeline.marks]
    assert ("a", "generation", "gen 2: rank 1 failed") in kinds
    assert ("a", "formed", "gen 2 formed 50 ms after the failure") in kinds
    assert ("rank 1 (a)", "spare", "spare pid 12 took the rank") in kinds


def marked(
    time: float, rank: int, steps: list[int], times: list[float], restart: int
) -> LoggedEvent:
    return ev(
        time, "StepsMarked", rank=rank, pid=10 + rank, restart_count=restart,
        generation=restart + 1, steps=steps, times=times, done=[], saves=[],
    )  # fmt: skip


STEPPED = [
    *RUN[:2],
    marked(100.9, 0, [0, 1], [100.6, 100.8], 0),
    *RUN[2:8],
    marked(101.9, 0, [1, 2], [101.7, 101.8], 1),
    ev(101.95, "StragglerDetected", rank=0, score=0.5, median=0.2, fastest=0.1, window_end=1.0),
    *RUN[8:],
]


def test_step_marks_add_a_goodput_lane_with_a_band_per_category() -> None:
    """With step marks, a goodput lane on top tiles the run with bands; each generation is
    labelled with its goodput; a straggler is marked on its rank's lane."""
    timeline = build_timeline(STEPPED)
    assert timeline.lanes[0] == "goodput"
    bands = [s for s in timeline.spans if s.kind == "goodput"]
    assert [s.outcome for s in bands] == [
        "startup", "productive", "redone", "recovery", "redone", "productive", "other",
    ]  # fmt: skip
    assert bands[0].start == 0.0
    assert bands[-1].end == pytest.approx(timeline.duration)
    lives = [m.label for m in timeline.marks if m.kind == "life"]
    assert lives == ["restart 0: 20% goodput", "restart 1: 12% goodput"]
    assert Mark("rank 0 (a)", pytest.approx(1.95), "straggler", "straggler (score 0.50)") in (
        timeline.marks
    )


def test_without_step_marks_there_is_no_goodput_lane() -> None:
    """A log without step marks draws as before: no goodput lane."""
    assert "goodput" not in build_timeline(RUN).lanes


def test_the_goodput_lane_is_drawn(tmp_path: Path) -> None:
    """A run with step marks renders to a PNG."""
    pytest.importorskip("matplotlib", reason="needs the timeline extra (matplotlib)")
    picture = tmp_path / "run.png"
    render_timeline(build_timeline(STEPPED), str(picture))
    assert picture.read_bytes()[:4] == b"\x89PNG"


MARKS = st.lists(
    st.tuples(
        st.sampled_from(["a", "rank 0 (a)"]),
        st.floats(0.0, 10.0),
        st.sampled_from(["x", "exit -9", "gen 2 formed 17 ms after the failure", "succeeded"]),
    ),
    max_size=30,
)


@given(MARKS)
def test_labels_placed_on_one_row_never_overlap_and_stay_in_the_run(
    marks: list[tuple[str, float, str]],
) -> None:
    """On a lane, the labels of one row never overlap; each stays within the run (a label
    narrower than half of it); a label not shown has its twin shown next to it."""
    from aioelastic.events._timeline import LABEL_POINTS_PER_CHAR, Timeline, place_labels

    timeline = Timeline(
        ("a", "rank 0 (a)"), (), tuple(Mark(*m[:2], "failed", m[2]) for m in marks), 10.0
    )
    per_char = LABEL_POINTS_PER_CHAR * 10.0 / 650.0
    shown: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    hidden = []
    for place in place_labels(timeline, plot_width=650.0):
        mark, width = place.mark, (len(place.mark.label) + 1) * per_char
        start = mark.time - width if place.leftward else mark.time
        if place.row is None:
            hidden.append((mark.lane, start, start + width, mark.label))
            continue
        assert (start >= 0.0, start + width <= 10.0) == (True, True)
        shown.setdefault((mark.lane, place.row), []).append((start, start + width, mark.label))
    for labels in shown.values():
        ordered = sorted(labels)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ordered))
    for lane, start, end, label in hidden:
        assert any(
            s <= end and e >= start and text == label
            for (shown_lane, _), labels in shown.items()
            for s, e, text in labels
            if shown_lane == lane
        )


def test_a_preemption_marks_the_node_and_each_rank_that_saved() -> None:
    """The notice and the stop step mark the node lane; each save marks its rank's lane; a
    rank that reached no boundary is named on the node lane."""
    run = [
        ev(100.0, "WorkersStarted", restart_count=0, ranks=[0, 1], pids=[10, 11]),
        ev(101.0, "PreemptionNoticed", by_node=1, signal=15, source="signal"),
        ev(101.1, "StopStepAgreed", step=7, since_notice=0.1),
        ev(101.5, "RankSaved", rank=0, local_rank=0, pid=10, step=7, since_notice=0.5),
        ev(101.6, "PreemptionEnded", step=7, saved=[0], no_boundary=[1], unsaved=[]),
    ]
    marks = [(m.lane, m.kind, m.label) for m in build_timeline(run).marks]
    assert marks == [
        ("a", "preempted", "preempted by node 1 (signal)"),
        ("a", "preempted", "stop at step 7"),
        ("rank 0 (a)", "saved", "saved at step 7"),
        ("a", "preempted", "rank 1: no step boundary before the deadline"),
    ]
