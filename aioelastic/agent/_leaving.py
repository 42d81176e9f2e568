"""When a survivor told its world ended is due to have left it: the in-place agent's deadlines.

A worker told that generation ``g`` ended has until ``leave_timeout`` later to enter a later
generation (it aborts its collectives and asks for the next world); one that answers that it
cannot abort them is due sooner (``cannot_abort_grace`` after its answer). Once due, the agent
reports a :class:`~aioelastic.agent._generations.LeaveDue` and the machine decides whether it
is still stuck there. Pure: times are the caller's clock.

The rule that matters: a worker is stuck in the *oldest* world it was told ended and has not
left. A later end (the generation that replaced it ended too, before the worker entered it)
never pushes that deadline out: the worker is in neither, and its first deadline still stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aioelastic.agent._generations import EvictCause, LeaveDue, WorkerKey


@dataclass(slots=True)
class Leaving:
    """A survivor told that ``generation`` ended, until it enters a later one."""

    generation: int
    due: float
    cause: EvictCause
    detail: str = ""


class LeaveDeadlines:
    """The survivors still to leave an ended world, and when each is due."""

    def __init__(self, leave_timeout: float, cannot_abort_grace: float) -> None:
        self.leave_timeout = leave_timeout
        self.cannot_abort_grace = cannot_abort_grace
        self._leaving: dict[WorkerKey, Leaving] = {}

    def ended(self, key: WorkerKey, generation: int, now: float) -> None:
        """``key`` is told that ``generation`` ended; an earlier end it has not left stands."""
        if key in self._leaving:
            return
        self._leaving[key] = Leaving(
            generation,
            now + self.leave_timeout,
            EvictCause.DID_NOT_LEAVE,
            f"not in a later generation {self.leave_timeout:g} s after",
        )

    def cannot_abort(self, key: WorkerKey, generation: int, detail: str, now: float) -> None:
        """``key`` answered that it cannot abort ``generation``'s collectives: due sooner."""
        leaving = self._leaving.get(key)
        if leaving is None or leaving.generation != generation:
            return  # it left that world meanwhile, or answers of one it was never told of
        leaving.due = min(leaving.due, now + self.cannot_abort_grace)
        leaving.cause = EvictCause.ABORT_UNAVAILABLE
        leaving.detail = detail

    def entered(self, key: WorkerKey, generation: int) -> None:
        """``key`` entered ``generation``: it left every world older than that."""
        leaving = self._leaving.get(key)
        if leaving is not None and generation > leaving.generation:
            del self._leaving[key]

    def forget(self, key: WorkerKey) -> None:
        """``key`` exited or was taken out: nothing is due of it any more."""
        self._leaving.pop(key, None)

    def next_due(self) -> float:
        """The earliest deadline (infinity: nobody is leaving)."""
        return min((leaving.due for leaving in self._leaving.values()), default=math.inf)

    def due(self, now: float) -> list[LeaveDue]:
        """Take out everyone due by ``now``: the machine's events for them, earliest first."""
        passed = sorted(
            (item for item in self._leaving.items() if item[1].due <= now),
            key=lambda item: item[1].due,
        )
        for key, _ in passed:
            del self._leaving[key]
        return [LeaveDue(key, left.generation, left.cause, left.detail) for key, left in passed]
