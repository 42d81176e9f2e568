"""What a rendezvous handler reports, and what the launcher says while a node waits to join.

The handlers (``aioelastic.rendezvous``, which re-exports them) and the progress watch
(``aioelastic/_launcher/progress.py``) emit them; the timeline and the metrics read them without
importing the rendezvous.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class InvalidationReason(enum.Enum):
    """Why the round a handler last completed is no longer valid."""

    NODES_WAITING = "nodes_waiting"
    """Nodes are waiting to join: the job should re-rendezvous to admit them."""
    PARTICIPANT_LOST = "participant_lost"
    """A participant of the round stopped heart-beating or left."""
    CLOSED = "closed"
    """The rendezvous was closed: the job is over."""
    FENCED = "fenced"
    """This node could not renew its liveness in time: others may have taken its ranks."""
    RESTARTING = "restarting"
    """Another node restarts the job's workers; every node starts the next attempt together
    (``static``, whose one set of members otherwise never changes)."""
    STORE_LOST = "store_lost"
    """The rendezvous store's server is gone (its host left or died): the job cannot go on."""


@dataclass(frozen=True, slots=True)
class RoundInvalidated:
    """The round a handler last completed is no longer valid, and why."""

    reason: InvalidationReason
    detail: str


@dataclass(frozen=True, slots=True)
class RoundJoining:
    """Event: this node started joining (``next_rendezvous`` was called)."""

    run_id: str
    node: int


@dataclass(frozen=True, slots=True)
class RoundCompleted:
    """Event: this node is ``rank`` of ``world_size`` in round ``round``."""

    run_id: str
    round: int
    node: int
    rank: int
    world_size: int


@dataclass(frozen=True, slots=True)
class NodeLost:
    """Event: this node reported ``lost`` (its ring successor in ``round``) gone."""

    run_id: str
    round: int
    lost: int


RendezvousEvent = RoundJoining | RoundCompleted | RoundInvalidated | NodeLost
"""What an elastic handler tells its subscribers (``RoundInvalidated`` says why a round ended)."""


@dataclass(frozen=True, slots=True)
class RendezvousWaiting:
    """A node has been joining run ``run_id`` for ``waited`` seconds; ``joined`` nodes so far.

    ``members`` names them (``"<node id> at <address>"``) when the handler can say;
    ``waiting_for`` is what the node waits for before it can count them (a store it has not
    reached yet: a static node whose rank 0 is not up), when there is such a thing.
    """

    run_id: str
    node: int
    joined: int
    min_nodes: int
    max_nodes: int
    waited: float
    join_timeout: float
    members: tuple[str, ...] = ()
    waiting_for: str = ""

    def describe(self) -> str:
        """One line for humans: what the node waits for."""
        left = max(0.0, self.join_timeout - self.waited)
        if self.waiting_for:
            return (
                f"rendezvous {self.run_id!r}: node {self.node} waiting {self.waited:.0f} s for "
                f"{self.waiting_for}; join timeout in {left:.0f} s"
            )
        if self.joined < self.min_nodes:
            missing = self.min_nodes - self.joined
            wanted = f"{missing} more node{'s' if missing > 1 else ''} (min_nodes={self.min_nodes})"
        else:
            wanted = f"the last call for up to max_nodes={self.max_nodes} to end"
        shown = ", ".join(f"node {m}" for m in self.members[:6])
        if len(self.members) > 6:
            shown += ", ..."
        return (
            f"rendezvous {self.run_id!r}: node {self.node} waiting {self.waited:.0f} s for "
            f"{wanted}; {self.joined} joined so far{f' ({shown})' if shown else ''}; "
            f"join timeout in {left:.0f} s"
        )
