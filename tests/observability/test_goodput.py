"""Goodput accounting from event records (pure): bands, categories, recoveries, the JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.events import LoggedEvent, read_event_log
from aioelastic.events._goodput import BADPUT, PRODUCTIVE, goodput_report, run_settings
from aioelastic.events._stragglers import StragglerSettings


def ev(time: float, kind: str, node: str = "a", **data: Any) -> LoggedEvent:
    return LoggedEvent(time, node, "agent", kind, data)


def steps(
    rank: int,
    marks: list[tuple[int, float]],
    *,
    restart: int = 0,
    generation: int = 1,
    saves: list[tuple[float, float]] = (),  # type: ignore[assignment]
    done: list[tuple[int, float]] = (),  # type: ignore[assignment]
) -> LoggedEvent:
    """A StepsMarked record (logged when its last mark was)."""
    return ev(
        max([t for _, t in marks] + [b for _, b in saves] + [0.0]),
        "StepsMarked",
        rank=rank,
        pid=100 + rank,
        restart_count=restart,
        generation=generation,
        steps=[s for s, _ in marks],
        times=[t for _, t in marks],
        done=[list(d) for d in done],
        saves=[list(s) for s in saves],
    )


def failed(time: float, rank: int, *, logged: float | None = None) -> LoggedEvent:
    """A WorkerFailed record: the failure at ``time``, logged at ``logged``."""
    failure = {"rank": rank, "local_rank": rank, "pid": 100 + rank, "returncode": -9}
    return ev(
        time if logged is None else logged, "WorkerFailed", failure={**failure, "timestamp": time}
    )


def seconds(report: Any) -> dict[str, float]:
    return {c: round(report.seconds(c), 6) for c in (PRODUCTIVE, *BADPUT)}


def test_a_clean_run_is_start_up_then_steps_then_the_tail() -> None:
    """Start-up until the first step; each step until the next is productive; after the last
    step, one typical step more is productive and the rest is other."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 2.0), (1, 3.0), (2, 4.0)]),
            ev(10.0, "RunFinished"),
        ]
    )
    assert seconds(report) == {
        PRODUCTIVE: 3.0, "startup": 2.0, "recovery": 0, "redone": 0,
        "checkpoint": 0, "idle": 0, "other": 5.0,
    }  # fmt: skip
    assert report.goodput == pytest.approx(0.3)
    assert report.badput["other"] == pytest.approx(0.5)


def test_the_job_begins_a_step_when_its_last_rank_does() -> None:
    """With two ranks, a step of the job starts at the later of their marks."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0), (1, 2.0)]),
            steps(1, [(0, 1.5), (1, 3.0)]),
            ev(5.0, "RunFinished"),
        ]
    )
    assert [(b.start, b.end, b.category) for b in report.bands] == [
        (0.0, 1.5, "startup"),
        (1.5, 4.5, PRODUCTIVE),  # steps 0 and 1 (one typical step long), joined
        (4.5, 5.0, "other"),
    ]


def test_a_failure_costs_the_cut_step_a_recovery_and_the_re_done_steps() -> None:
    """Killed at 4.5 in step 3 (checkpoint at step 2): step 3 until the failure is re-done, the
    failure until the restarted job's first step is recovery, steps 2 and 3 again are re-done."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0), (4, 4.9)]),  # rank 0 ran on
            steps(1, [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0)]),
            failed(4.5, 1, logged=5.0),
            steps(0, [(2, 8.0), (3, 9.0), (4, 10.0), (5, 11.0)], restart=1, generation=2),
            steps(1, [(2, 8.0), (3, 9.0), (4, 10.0), (5, 11.0)], restart=1, generation=2),
            ev(12.0, "RunFinished"),
        ]
    )
    assert [(b.start, b.end, b.category) for b in report.bands] == [
        (0.0, 1.0, "startup"),
        (1.0, 4.0, PRODUCTIVE),
        (4.0, 4.5, "redone"),
        (4.5, 8.0, "recovery"),
        (8.0, 10.0, "redone"),
        (10.0, 12.0, PRODUCTIVE),
    ]
    (recovery,) = report.recoveries
    assert (recovery.cause, recovery.rank, recovery.failed_at, recovery.resumed_at) == (
        "WorkerFailed", 1, 4.5, 8.0,
    )  # fmt: skip
    assert recovery.seconds == 3.5
    assert (report.redone_steps, report.last_step) == (2, 5)


def test_later_failures_of_one_incident_do_not_open_another_recovery() -> None:
    """A second failure before the job made a step again belongs to the first one's recovery."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0)]),
            failed(2.0, 0),
            ev(2.5, "MembershipChanged", reason="PARTICIPANT_LOST", detail=""),
            steps(0, [(1, 4.0), (2, 5.0)], restart=1, generation=2),
        ]
    )
    assert [r.failed_at for r in report.recoveries] == [2.0]
    assert report.seconds("recovery") == 2.0


def test_a_job_that_never_steps_again_ends_in_recovery() -> None:
    """After the last restart fails, the rest of the log is recovery that never resumed."""
    report = goodput_report(
        [ev(0.0, "RendezvousJoining"), steps(0, [(0, 1.0), (1, 2.0)]), failed(2.5, 0),
         ev(6.0, "RunFinished")]
    )  # fmt: skip
    (recovery,) = report.recoveries
    assert (recovery.resumed_at, recovery.seconds) == (None, 3.5)
    assert report.seconds("recovery") == 3.5


def test_a_rank_that_resumes_past_a_step_has_reached_it() -> None:
    """Ranks not in lockstep: a survivor checkpoints step 3 of the new generation before the
    replacement starts, which resumes at step 4; the recovery ends when the replacement
    begins, and the slow rank's steps 2 and 3 after it are the job's (it is where its slowest
    rank is), not more recovery."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0), (1, 2.0), (2, 3.0)]),
            steps(1, [(0, 1.0), (1, 2.0), (2, 3.0)]),
            steps(2, [(0, 1.0), (1, 3.0)]),  # the slow rank
            failed(3.5, 1),
            steps(0, [(1, 4.0), (2, 4.5), (3, 5.0), (4, 5.5), (5, 6.0)], generation=2),
            steps(2, [(1, 4.0), (2, 6.0), (3, 8.0), (4, 10.0), (5, 12.0)], generation=2),
            steps(1, [(4, 7.0), (5, 7.5)], generation=2),  # the replacement, from checkpoint 4
            ev(13.0, "RunFinished"),
        ]
    )
    (recovery,) = report.recoveries
    assert (recovery.failed_at, recovery.resumed_at) == (3.5, 7.0)
    assert [(b.start, b.end, b.category) for b in report.bands] == [
        (0.0, 1.0, "startup"),
        (1.0, 3.0, PRODUCTIVE),  # step 0 (rank 2 begins step 1 at 3.0)
        (3.0, 3.5, "redone"),  # step 1, cut short by the failure
        (3.5, 7.0, "recovery"),
        (7.0, 13.0, PRODUCTIVE),  # steps 2 (from 7.0: the job jumped to it), 3, 4, 5
    ]
    assert (report.redone_steps, report.last_step) == (0, 5)


def test_nodes_waiting_to_join_is_idle_not_recovery() -> None:
    """The job stopping to admit nodes is idle time until its next step, and no recovery."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0), (1, 2.0)]),
            ev(2.5, "MembershipChanged", reason="NODES_WAITING", detail="a node waits"),
            steps(0, [(2, 6.0), (3, 7.0)], restart=0, generation=2),
        ]
    )
    assert report.recoveries == ()
    assert report.seconds("idle") == 3.5
    assert report.seconds("redone") == 0.5  # the step it cut short


def test_marked_checkpoint_saves_are_cut_out_of_the_steps() -> None:
    """A save marked inside a productive step counts as checkpoint, not as training."""
    report = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0), (1, 3.0), (2, 5.0)], saves=[(2.0, 2.5)]),
            steps(1, [(0, 1.0), (1, 3.0), (2, 5.0)], saves=[(2.2, 2.7)]),
        ]
    )
    assert report.seconds("checkpoint") == pytest.approx(0.7)
    assert report.seconds(PRODUCTIVE) == pytest.approx(3.3)


def test_without_step_marks_everything_is_other() -> None:
    """A log with no step marks cannot tell start-up from training: all of it is other."""
    report = goodput_report([ev(0.0, "RendezvousJoining"), ev(4.0, "RunFinished")])
    assert seconds(report)["other"] == 4.0
    assert report.goodput == 0.0


def test_an_empty_log_is_an_empty_report() -> None:
    """No records: zero wall time, zero goodput, every badput cause zero."""
    report = goodput_report([])
    assert (report.wall_seconds, report.goodput) == (0.0, 0.0)
    assert set(report.badput.values()) == {0.0}


def test_the_report_scores_stragglers_over_every_rank() -> None:
    """A rank three times slower than the fastest is named in each window it is scored in."""
    fast = [(s, 10.0 + s * 0.1) for s in range(40)]
    slow = [(s, 10.0 + s * 0.3) for s in range(14)]
    report = goodput_report(
        [steps(0, fast), steps(1, fast), steps(2, slow)],
        stragglers=StragglerSettings(window=1.0),
    )
    assert [s.rank for s in report.stragglers] == [2]
    assert report.rank_step_seconds()[2] == pytest.approx(0.3)
    assert report.stragglers[0].lowest_score == pytest.approx(1 / 3)


def test_the_run_settings_come_from_its_step_times() -> None:
    """The report uses the window and factor the run's agents used, else the defaults."""
    times = ev(0.0, "StepTimes", start=10.0, end=15.0, ranks=[], stragglers=[], factor=2.0)
    assert run_settings([times]) == (5.0, 2.0)
    assert run_settings([]) == (StragglerSettings().window, StragglerSettings().factor)


JSON_KEYS = {
    "version": int, "start": float, "end": float, "wall_seconds": float, "goodput": float,
    "productive_seconds": float, "badput": dict, "badput_seconds": dict, "recoveries": list,
    "steps": dict, "generations": list, "stragglers": list, "rank_step_seconds": dict,
    "straggler_window": dict, "bands": list,
}  # fmt: skip


def test_the_json_object_has_its_documented_shape() -> None:
    """`report --json`: the documented keys and types; badput lists every cause."""
    data = goodput_report(
        [
            ev(0.0, "RendezvousJoining"),
            steps(0, [(0, 1.0), (1, 2.0)]),
            failed(2.5, 0),
            steps(0, [(1, 4.0), (2, 5.0)], restart=1, generation=2),
        ]
    ).to_json()
    json.dumps(data)  # plain data
    assert {k: type(v) for k, v in data.items()} == JSON_KEYS
    assert list(data["badput"]) == list(BADPUT) == list(data["badput_seconds"])
    assert set(data["recoveries"][0]) == {
        "cause", "node", "rank", "failed_at", "resumed_at", "seconds",
    }  # fmt: skip
    assert set(data["steps"]) == {"marked", "last", "redone"}
    assert set(data["generations"][0]) == {
        "restart_count", "generation", "start", "end", "goodput",
    }  # fmt: skip
    assert set(data["bands"][0]) == {"start", "end", "category"}


# -- invariants over random logs -------------------------------------------------------------


@st.composite
def logs(draw: st.DrawFn) -> list[LoggedEvent]:
    """Random logs: marks of a few ranks in a few lives, failures, membership changes, saves."""
    events = [ev(0.0, "RendezvousJoining")]
    now, life, step = 0.0, 0, 0
    for _ in range(draw(st.integers(0, 30))):
        now += draw(st.floats(0.0, 3.0))
        action = draw(st.sampled_from(["step", "step", "step", "fail", "join", "restart"]))
        if action == "step":
            ranks = draw(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True))
            save = draw(st.one_of(st.none(), st.tuples(st.floats(0, 5), st.floats(0, 5))))
            saves = [] if save is None else [(now - save[0], now - save[0] + save[1])]
            step += draw(st.integers(-3, 2))
            for rank in ranks:
                lag = draw(st.floats(0.0, 0.5))
                events.append(
                    steps(rank, [(step, now + lag)], restart=life, generation=life, saves=saves)
                )
        elif action == "fail":
            events.append(failed(now, draw(st.integers(0, 3)), logged=now + draw(st.floats(0, 1))))
        elif action == "join":
            reason = draw(st.sampled_from(["NODES_WAITING", "PARTICIPANT_LOST"]))
            events.append(ev(now, "MembershipChanged", reason=reason, detail=""))
        else:
            life += 1
            step = draw(st.integers(0, max(0, step)))
    events.append(ev(now + draw(st.floats(0.0, 5.0)), "RunFinished"))
    return events


@given(logs())
def test_the_categories_always_add_up_to_the_wall_time(events: list[LoggedEvent]) -> None:
    """Whatever the log, the bands tile the wall time: no gap, no overlap, none negative."""
    report = goodput_report(events)
    total = sum(report.seconds(c) for c in (PRODUCTIVE, *BADPUT))
    assert total == pytest.approx(report.wall_seconds, abs=1e-6)
    cursor = report.start
    for band in report.bands:
        assert band.start == pytest.approx(cursor, abs=1e-9)
        assert band.end > band.start
        cursor = band.end
    assert cursor == pytest.approx(report.end, abs=1e-9) or not report.bands


@given(logs())
def test_every_fraction_is_between_zero_and_one(events: list[LoggedEvent]) -> None:
    """Goodput and each badput share lie in [0, 1] and add up to 1 (or all are 0)."""
    report = goodput_report(events)
    shares = [report.goodput, *report.badput.values()]
    assert all(0.0 <= share <= 1.0 for share in shares)
    assert sum(shares) == pytest.approx(1.0 if report.wall_seconds > 0 else 0.0, abs=1e-6)


@given(logs())
def test_recoveries_never_overlap_and_fit_the_wall_time(events: list[LoggedEvent]) -> None:
    """Each recovery starts after the previous one resumed and within the log."""
    report = goodput_report(events)
    last = report.start
    for recovery in report.recoveries:
        assert recovery.failed_at >= last
        assert recovery.seconds >= 0
        end = recovery.resumed_at if recovery.resumed_at is not None else report.end
        assert end <= report.end
        last = end


@given(logs())
def test_the_report_does_not_depend_on_the_order_of_the_records(
    events: list[LoggedEvent],
) -> None:
    """Logs of many nodes come in any order: the report is the same."""
    assert goodput_report(events).bands == goodput_report(events[::-1]).bands


# -- the command ---------------------------------------------------------------------------


def run_report(*args: str | Path) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "aioelastic", "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def test_the_report_command_prints_json_and_text(tmp_path: Path) -> None:
    """`aioelastic report --json` prints the report's object; without it, a readable summary."""
    log = tmp_path / "events.jsonl"
    records = [
        ev(0.0, "RendezvousJoining"),
        steps(0, [(0, 1.0), (1, 2.0), (2, 3.0)]),
        failed(3.5, 0),
        steps(0, [(2, 5.0), (3, 6.0)], restart=1, generation=2),
    ]
    with log.open("w") as file:
        for e in records:
            file.write(json.dumps({"time": e.time, "node": e.node, "source": e.source,
                                   "kind": e.kind, "event": e.data}) + "\n")  # fmt: skip
    code, out, err = run_report(log, "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(goodput_report(read_event_log(log)).to_json()))
    code, out, err = run_report(log)
    assert code == 0, err
    assert "recovery: WorkerFailed rank 0" in out
    assert "goodput" in out


def test_a_file_that_is_no_event_log_is_a_one_line_error(tmp_path: Path) -> None:
    """`aioelastic report` on a file that is not an event log names the file and line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    code, _, err = run_report(bad)
    assert code == 2
    assert err.startswith(f"aioelastic report: error: {bad}:1: not JSON")
    assert len(err.strip().splitlines()) == 1


def test_a_straggler_factor_not_over_one_is_a_one_line_error(tmp_path: Path) -> None:
    """`--straggler-factor 0.5` would name every rank: refused, saying what it must be."""
    log = tmp_path / "events.jsonl"
    log.write_text('{"time": 1, "node": "a", "source": "agent", "kind": "X", "event": {}}\n')
    code, _, err = run_report(log, "--straggler-factor", "0.5")
    assert code == 2
    assert err.strip() == (
        "aioelastic report: error: the straggler factor must be > 1 (1/0.75 flags a rank 33% "
        "slower than the fastest), got 0.5"
    )
