"""What the agent does after an attempt: a pure policy, apart from the loop that acts on it.

An attempt of :class:`~aioelastic.agent._agent.ElasticAgent` ends with an
:class:`~aioelastic.agent._group.Outcome` (before its workers started, too: a round that moved
on while ranks were assigned). :func:`after_attempt` turns it, and the restarts used so far,
into the next step. The table, in words: success passes the exit barrier; a membership change
or this node being fenced re-rendezvouses without costing a restart; a rendezvous closed by
another node ends the run as failed (nobody else needs telling); a failure restarts the group
while restarts remain, and otherwise closes the rendezvous so the other nodes stop too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aioelastic.agent._group import Outcome


class Step(enum.Enum):
    """The agent's next step after an attempt."""

    SUCCEED = "pass the exit barrier and end the run as succeeded"
    REJOIN = "re-rendezvous without costing a restart"
    RESTART = "re-rendezvous and restart the group, costing one restart"
    GIVE_UP = "close the rendezvous for every node and end the run as failed"
    END = "end the run as failed; the job already ended elsewhere"


@dataclass(frozen=True, slots=True)
class Decision:
    """A :class:`Step` and the reason the run reports if it ends there."""

    step: Step
    reason: str


def after_attempt(
    outcome: Outcome, detail: str, *, restart_count: int, max_restarts: int
) -> Decision:
    """The next step after an attempt that ended with ``outcome`` (``detail`` says why)."""
    match outcome:
        case Outcome.SUCCEEDED:
            return Decision(Step.SUCCEED, detail)
        case Outcome.MEMBERSHIP | Outcome.FENCED:
            return Decision(Step.REJOIN, detail)
        case Outcome.CLOSED:
            return Decision(Step.END, detail)
        case Outcome.FAILED if restart_count < max_restarts:
            return Decision(Step.RESTART, detail)
        case Outcome.FAILED:
            return Decision(Step.GIVE_UP, f"restarts exhausted ({max_restarts} allowed)")
    raise AssertionError(outcome)  # pragma: no cover
