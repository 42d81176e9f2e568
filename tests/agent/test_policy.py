"""The agent's decision after an attempt (``agent/_policy.py``), as plain calls."""

from __future__ import annotations

import pytest

from aioelastic.agent._group import Outcome
from aioelastic.agent._policy import Decision, Step, after_attempt


@pytest.mark.parametrize(
    ("outcome", "step"),
    [
        (Outcome.SUCCEEDED, Step.SUCCEED),
        (Outcome.MEMBERSHIP, Step.REJOIN),
        (Outcome.FENCED, Step.REJOIN),
        (Outcome.CLOSED, Step.END),
        (Outcome.FAILED, Step.RESTART),
    ],
)
def test_each_outcome_with_restarts_left(outcome: Outcome, step: Step) -> None:
    """With restarts left, each outcome maps to its step and keeps its reason."""
    assert after_attempt(outcome, "why", restart_count=0, max_restarts=3) == Decision(step, "why")


@pytest.mark.parametrize("outcome", [Outcome.MEMBERSHIP, Outcome.FENCED, Outcome.CLOSED])
def test_only_a_failure_spends_restarts(outcome: Outcome) -> None:
    """With no restart left, a membership change, fencing or a close decide as before."""
    spent = after_attempt(outcome, "why", restart_count=3, max_restarts=3)
    assert spent == after_attempt(outcome, "why", restart_count=0, max_restarts=3)


def test_a_failure_without_restarts_left_gives_up_saying_so() -> None:
    """The last allowed restart spent: a failure closes the job, naming the budget."""
    decision = after_attempt(Outcome.FAILED, "rank 1 failed", restart_count=2, max_restarts=2)
    assert decision == Decision(Step.GIVE_UP, "restarts exhausted (2 allowed)")


def test_the_last_restart_is_still_a_restart() -> None:
    """restart_count one below the budget: one more restart."""
    decision = after_attempt(Outcome.FAILED, "why", restart_count=1, max_restarts=2)
    assert decision.step is Step.RESTART
