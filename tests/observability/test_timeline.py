"""The run timeline: lanes built from event records (pure), drawn as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
    from aioelastic.events._timeline import _label_offsets

    timeline = build_timeline(
        [
            ev(0.0, "RendezvousCompleted", group_rank=0, group_world_size=2),
            ev(5.0, "NodeLost", round=1, lost=2),
            ev(5.0, "RoundInvalidated", reason="participant_lost"),
            ev(5.0, "MembershipChanged", reason="PARTICIPANT_LOST"),
            ev(10.0, "RunFinished", result={"state": "succeeded"}),
        ]
    )
    offsets = [(mark.label, raise_by) for mark, raise_by in _label_offsets(timeline)]
    assert offsets == [
        ("reported node 2 lost", 0),
        ("participant_lost", 1),
        ("participant_lost", None),
        ("succeeded", 0),
    ]


def test_in_place_recovery_draws_generations_and_the_spare_taking_the_rank() -> None:
    """A spare takes rank 1: the rank's lane gets a second life; the node lane marks gen 2."""
    run = [
        ev(100.0, "RendezvousCompleted", group_rank=0, group_world_size=1, world_size=2),
        ev(100.1, "SpareStarted", pid=12),
        ev(100.1, "WorkersStarted", restart_count=0, ranks=[0, 1], pids=[10, 11]),
        ev(
            101.0, "WorkerFailed", failure={"local_rank": 1, "rank": 1, "pid": 11, "returncode": -9}
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
    rank1 = [(s.label, s.outcome) for s in timeline.spans if s.lane == "rank 1 (a)"]
    assert rank1 == [("pid 11, restart 0", "failed"), ("pid 12, gen 2", "succeeded")]
    kinds = [(m.lane, m.kind, m.label) for m in timeline.marks]
    assert ("a", "generation", "gen 2: rank 1 failed") in kinds
    assert ("a", "formed", "gen 2 formed 50 ms after the failure") in kinds
    assert ("rank 1 (a)", "spare", "spare pid 12 took the rank") in kinds


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
