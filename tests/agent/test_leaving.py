"""The in-place agent's deadlines for survivors to leave an ended world (pure)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent._generations import EvictCause, LeaveDue, WorkerKey
from aioelastic.agent._leaving import LeaveDeadlines

A, B = WorkerKey(0, 0), WorkerKey(1, 0)


def deadlines() -> LeaveDeadlines:
    return LeaveDeadlines(leave_timeout=30.0, cannot_abort_grace=2.0)


def test_a_survivor_that_cannot_abort_is_due_after_the_grace() -> None:
    leaving = deadlines()
    leaving.ended(A, 1, now=10.0)
    assert leaving.next_due() == 40.0
    leaving.cannot_abort(A, 1, "turned off", now=11.0)
    assert leaving.due(12.9) == []
    assert leaving.due(13.0) == [LeaveDue(A, 1, EvictCause.ABORT_UNAVAILABLE, "turned off")]
    assert leaving.next_due() == math.inf


def test_a_later_end_keeps_the_first_deadline_of_a_survivor_still_stuck() -> None:
    """Two survivors cannot abort; one is taken out first, which ends the generation the other
    was assigned to but never entered: the other is still due at its own first deadline (it
    once waited out --recovery-timeout / 2, and gloo's own timeout came first)."""
    leaving = deadlines()
    for key in (A, B):
        leaving.ended(key, 1, now=10.0)
        leaving.cannot_abort(key, 1, "turned off", now=10.0 + key.node * 0.1)
    assert leaving.due(12.05) == [LeaveDue(A, 1, EvictCause.ABORT_UNAVAILABLE, "turned off")]
    leaving.ended(B, 2, now=12.05)  # A's eviction ends generation 2
    assert leaving.due(12.1) == [LeaveDue(B, 1, EvictCause.ABORT_UNAVAILABLE, "turned off")]


def test_entering_a_later_generation_clears_the_deadline_an_older_one_does_not() -> None:
    leaving = deadlines()
    leaving.ended(A, 2, now=0.0)
    leaving.entered(A, 2)
    assert leaving.next_due() == 30.0
    leaving.entered(A, 3)
    assert leaving.due(math.inf) == []


def test_answers_of_another_world_change_nothing() -> None:
    leaving = deadlines()
    leaving.cannot_abort(A, 1, "x", now=0.0)  # never told
    leaving.ended(A, 2, now=0.0)
    leaving.cannot_abort(A, 1, "x", now=0.0)  # of a world it left
    assert leaving.due(29.0) == []
    leaving.forget(A)
    assert leaving.due(math.inf) == []


ops = st.lists(
    st.tuples(
        st.sampled_from(["ended", "cannot_abort", "entered", "forget"]),
        st.sampled_from([A, B]),
        st.integers(1, 4),
        st.floats(0, 5),
    ),
    max_size=30,
)


@given(ops)
def test_a_deadline_is_the_earliest_owed_since_the_oldest_unleft_end(
    script: list[tuple[str, WorkerKey, int, float]],
) -> None:
    """Model: per key, the oldest world it was told ended and has not left; its deadline is
    30 s after that end, or 2 s after a cannot-abort answer about that world, whichever first."""
    leaving, model = deadlines(), dict[WorkerKey, tuple[int, float]]()
    now = 0.0
    for op, key, generation, step in script:
        now += step
        if op == "ended":
            leaving.ended(key, generation, now)
            model.setdefault(key, (generation, now + 30.0))
        elif op == "cannot_abort":
            leaving.cannot_abort(key, generation, "", now)
            if key in model and model[key][0] == generation:
                model[key] = (generation, min(model[key][1], now + 2.0))
        elif op == "entered":
            leaving.entered(key, generation)
            if key in model and generation > model[key][0]:
                del model[key]
        else:
            leaving.forget(key)
            model.pop(key, None)
    assert leaving.next_due() == min((due for _, due in model.values()), default=math.inf)
    due = leaving.due(math.inf)
    assert {(d.worker, d.generation) for d in due} == {(k, g) for k, (g, _) in model.items()}
