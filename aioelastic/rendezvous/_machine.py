"""The elastic rendezvous algorithm: a pure state machine (no I/O, no clock; ``now`` is passed in).

Theory of operation. Rounds are numbered 1, 2, ...; a node joins the round after the last
sealed one (``state/latest``, which only moves forward), or after the last round it completed
itself if that is later: the sealer that advances ``state/latest`` may have died first. It
writes its join record, then bumps the round's arrival counter: the value the counter returns
is the node's arrival number ``i``, and every node that arrived before it has already written
its record. Nobody watches the arrivals except in the rare recovery case below;
each joined node waits for one key, the round's *result*, which is written once with
compare-and-set, so every node of a round reads the same sealed outcome:

* the node with ``i == max_nodes`` seals at once (if ``max_nodes`` joined nodes are alive);
* the node with ``i == min_nodes`` seals ``last_call_timeout`` after its arrival; a node with
  ``i > min_nodes`` knows that ``min_nodes`` had arrived before it, so it arms the same timer
  as a fallback (in case the earlier sealer died); the first one due wins the compare-and-set;
* a sealer reads the join records and the nodes' liveness keys (TTL keys refreshed by each
  node, expired by the store's clock) and seals the live joiners, previous members first, at
  most ``max_nodes``; with fewer than ``min_nodes`` alive it waits for more joins instead;
* a node that finds a result without itself (it came late, or the round was full) joins the
  next round, where it is a *waiting node*; a result saying ``closed`` ends the job;
* a node that reaches ``join_timeout`` withdraws its record, then reads the result once more
  (it may have been sealed in meanwhile) before reporting a timeout.

Each node does a constant number of store operations per round, so a round costs O(N) in total.
Ranks: a member of the previous round keeps its rank when that rank is below the new world
size; the others fill the free ranks (previous members first, then by node id).

After a round completes, the keys of the next round are its *inbox* (:func:`assess_inbox`): a
join record there means nodes are waiting, a *lost* mark that a member is gone (written by the
member itself when it leaves, or by its ring predecessor, :func:`ring_successor`, once its
liveness key expired), and a ``closed`` result that the job is over. The next round's arrival
counter doubles as the inbox's doorbell, so members wait for one key, not for a prefix.

The machine is driven by :meth:`JoinMachine.send`: it takes an :class:`Event` (the outcome of
the previous :class:`Command`) and returns the next command; :data:`TRANSITIONS` lists, for
each phase, the events it accepts and the phases it may move to.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

from aioelastic.rendezvous._errors import RendezvousStateError
from aioelastic.rendezvous._info import InvalidationReason, RoundInvalidated

# -- keys, relative to the run's namespace -----------------------------------------------------

CLOSED_KEY = "state/closed"
LATEST_KEY = "state/latest"
NODE_IDS_KEY = "state/node_ids"
STATE_PREFIX = "state/"
CLOSED_RESULT = b"closed"


def round_prefix(round_: int) -> str:
    """Everything about round ``round_``; members of the round before watch it as their inbox."""
    return f"round/{round_}/"


def join_prefix(round_: int) -> str:
    return f"round/{round_}/join/"


def join_key(round_: int, node: int) -> str:
    return f"round/{round_}/join/{node}"


def count_key(round_: int) -> str:
    """The arrival counter of a round; it doubles as the doorbell of that round's inbox:
    whoever reports a loss or closes the run there adds 0 to it, so the members of the round
    before wait for one key to appear instead of re-reading a prefix."""
    return f"round/{round_}/count"


def result_key(round_: int) -> str:
    return f"round/{round_}/result"


def lost_key(round_: int, node: int) -> str:
    """Where a member of round ``round_ - 1`` is reported gone."""
    return f"round/{round_}/lost/{node}"


def alive_prefix(node: int | None = None) -> str:
    return "node/" if node is None else f"node/{node}/"


def alive_key(node: int) -> str:
    return f"node/{node}/alive"


_HEARTBEAT_TIMEOUT_TAG = b"ttl="


def encode_alive(heartbeat_timeout: float) -> bytes:
    """A liveness key's value: the TTL it is written with, so readers can age the heartbeat."""
    return _HEARTBEAT_TIMEOUT_TAG + repr(float(heartbeat_timeout)).encode()


def parse_heartbeat_timeout(value: bytes) -> float | None:
    """The TTL a liveness key value records (None for a value without one, e.g. ``b"1"``)."""
    if not value.startswith(_HEARTBEAT_TIMEOUT_TAG):
        return None
    try:
        timeout = float(value[len(_HEARTBEAT_TIMEOUT_TAG) :])
    except ValueError:
        return None
    return timeout if timeout > 0 and math.isfinite(timeout) else None


def parse_alive(items: Iterable[str]) -> frozenset[int]:
    """The node ids whose liveness key is among ``items`` (keys relative to the namespace)."""
    return frozenset(int(key.split("/")[1]) for key in items if key.endswith("/alive"))


# -- records -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinRecord:
    """What a node tells the round it joins: where it is and what rank it had last round."""

    node: int
    addr: str
    port: int
    prev_round: int = 0
    prev_rank: int = -1

    def encode(self) -> bytes:
        return json.dumps([self.addr, self.port, self.prev_round, self.prev_rank]).encode()

    @classmethod
    def decode(cls, node: int, data: bytes) -> JoinRecord:
        try:
            addr, port, prev_round, prev_rank = json.loads(data)
            return cls(node, str(addr), int(port), int(prev_round), int(prev_rank))
        except (ValueError, TypeError) as error:
            raise RendezvousStateError(
                f"join record of node {node} is malformed ({data[:60]!r}): {error}; "
                "is another program or version using this run id?"
            ) from None


def parse_records(items: Mapping[str, bytes]) -> dict[int, JoinRecord]:
    """Decode the join records among ``items`` (keys ``.../join/<node>``)."""
    records = {}
    for key, data in items.items():
        node = int(key.rsplit("/", 1)[1])
        records[node] = JoinRecord.decode(node, data)
    return records


class Members(tuple[int, ...]):
    """Node ids in rank order; ``index`` and ``in`` are dict lookups, not scans, so each of N
    nodes finding itself (or its ring successor) in a round of N costs O(1), not O(N)."""

    _ranks: dict[int, int]

    def __new__(cls, nodes: Iterable[int]) -> Members:
        self = super().__new__(cls, nodes)
        self._ranks = {node: rank for rank, node in enumerate(self)}
        return self

    def index(self, value: Any, start: SupportsIndex = 0, stop: SupportsIndex = sys.maxsize) -> int:
        rank = self._ranks.get(value)
        if rank is None or not (int(start) == 0 and int(stop) == sys.maxsize):
            return super().index(value, start, stop)
        return rank

    def __contains__(self, value: object) -> bool:
        return value in self._ranks

    def rank(self, node: int) -> int | None:
        """The rank of ``node``, or None if it is not a member."""
        return self._ranks.get(node)

    def __repr__(self) -> str:
        return tuple.__repr__(self)


@dataclass(frozen=True, slots=True)
class RoundResult:
    """A sealed round: its members in rank order and where rank 0 is."""

    round: int
    members: tuple[int, ...]
    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if not isinstance(self.members, Members):
            object.__setattr__(self, "members", Members(self.members))

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, node: int) -> int | None:
        members = self.members
        assert isinstance(members, Members)  # __post_init__ made it one
        return members.rank(node)

    def encode(self) -> bytes:
        return json.dumps([self.master_addr, self.master_port, self.members]).encode()

    @classmethod
    def decode(cls, round_: int, data: bytes) -> RoundResult:
        return _decode_result(round_, data)


@functools.lru_cache(maxsize=8)
def _decode_result(round_: int, data: bytes) -> RoundResult:
    """Decode a result once per process: the nodes of a simulation all read the same bytes."""
    try:
        addr, port, members = json.loads(data)
        return RoundResult(round_, Members(int(m) for m in members), str(addr), int(port))
    except (ValueError, TypeError) as error:
        raise RendezvousStateError(
            f"result of round {round_} is malformed ({data[:60]!r}): {error}; "
            "is another program or version using this run id?"
        ) from None


def seal(round_: int, candidates: Iterable[JoinRecord], max_nodes: int) -> RoundResult:
    """Choose at most ``max_nodes`` of ``candidates`` and rank them.

    Members of the previous round go first (the running job keeps its nodes); each keeps its
    old rank if it is below the new world size; the others take the free ranks in that order.
    """
    ordered = sorted(candidates, key=lambda r: (r.prev_round != round_ - 1, r.node))
    chosen = ordered[:max_nodes]
    size = len(chosen)
    ranks: list[JoinRecord | None] = [None] * size
    rest = []
    for record in chosen:
        if record.prev_round == round_ - 1 and 0 <= record.prev_rank < size:
            ranks[record.prev_rank] = record
        else:
            rest.append(record)
    free = iter(rest)
    members = [slot if slot is not None else next(free) for slot in ranks]
    return RoundResult(round_, Members(r.node for r in members), members[0].addr, members[0].port)


# -- the join state machine --------------------------------------------------------------------


class Phase(enum.Enum):
    """Where a node is in joining a round."""

    READING = "reading the run's state"
    ANNOUNCING = "writing the join record"
    COUNTING = "taking an arrival number"
    WAITING = "waiting for the round's result"
    SEALING = "reading the candidates"
    PUBLISHING = "publishing the result"
    RECRUITING = "waiting for more live nodes"
    WITHDRAWING = "withdrawing after the join timeout"
    DONE = "joined"
    CLOSED = "closed"
    TIMED_OUT = "timed out"


# Events: the outcome of the previous command.


@dataclass(frozen=True, slots=True)
class StateRead:
    latest: int
    closed: bool


@dataclass(frozen=True, slots=True)
class Announced:
    pass


@dataclass(frozen=True, slots=True)
class Counted:
    arrival: int


@dataclass(frozen=True, slots=True)
class ResultSeen:
    value: bytes


@dataclass(frozen=True, slots=True)
class DeadlineReached:
    pass


@dataclass(frozen=True, slots=True)
class JoinsChanged:
    pass


@dataclass(frozen=True, slots=True)
class Candidates:
    records: Mapping[int, JoinRecord]
    alive: frozenset[int]


@dataclass(frozen=True, slots=True)
class Published:
    value: bytes


@dataclass(frozen=True, slots=True)
class Withdrawn:
    value: bytes | None
    """The round's result if it was sealed meanwhile."""
    live: int
    """Live nodes joined to the round (this one included) when the node withdrew."""


Event = (
    StateRead
    | Announced
    | Counted
    | ResultSeen
    | DeadlineReached
    | JoinsChanged
    | Candidates
    | Published
    | Withdrawn
)

# Commands: what the shell must do next (each is one or two store operations).


@dataclass(frozen=True, slots=True)
class ReadState:
    """Read ``state/`` -> :class:`StateRead`."""


@dataclass(frozen=True, slots=True)
class Announce:
    """Write the join record -> :class:`Announced`."""

    round: int
    record: JoinRecord


@dataclass(frozen=True, slots=True)
class Count:
    """Add 1 to the round's arrival counter -> :class:`Counted`."""

    round: int


@dataclass(frozen=True, slots=True)
class AwaitResult:
    """Wait for the round's result -> :class:`ResultSeen`, or :class:`DeadlineReached`."""

    round: int
    deadline: float


@dataclass(frozen=True, slots=True)
class ReadCandidates:
    """Read the round's join records and the liveness keys -> :class:`Candidates`."""

    round: int


@dataclass(frozen=True, slots=True)
class Publish:
    """Compare-and-set the result from empty; if it was stored, advance ``state/latest`` to
    ``round`` unless it is there or beyond already (it never moves back).

    -> :class:`Published` with the value now stored (ours or an earlier one).
    """

    round: int
    value: bytes


@dataclass(frozen=True, slots=True)
class AwaitJoins:
    """Wait for any change in the round, or for the liveness key of a ``lapsed`` joiner to
    come back -> :class:`ResultSeen` if the result exists, else :class:`JoinsChanged`; or
    :class:`DeadlineReached`."""

    round: int
    deadline: float
    lapsed: frozenset[int] = frozenset()
    """Joined nodes whose liveness key was missing (e.g. stopped, then resumed, processes)."""


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Count live joiners, delete the join record, read the result -> :class:`Withdrawn`."""

    round: int
    node: int


@dataclass(frozen=True, slots=True)
class Finish:
    """Terminal: the node is a member of ``result`` with ``rank``."""

    result: RoundResult
    rank: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Terminal: the job is closed, or the join timed out with ``live`` nodes joined."""

    reason: Phase
    round: int
    live: int = 0


Command = (
    ReadState
    | Announce
    | Count
    | AwaitResult
    | ReadCandidates
    | Publish
    | AwaitJoins
    | Withdraw
    | Finish
    | Fail
)

_TERMINAL = frozenset({Phase.DONE, Phase.CLOSED, Phase.TIMED_OUT})
_AFTER_RESULT = frozenset({Phase.DONE, Phase.CLOSED, Phase.ANNOUNCING})

TRANSITIONS: Mapping[Phase, Mapping[type[Event], frozenset[Phase]]] = {
    Phase.READING: {StateRead: frozenset({Phase.CLOSED, Phase.ANNOUNCING})},
    Phase.ANNOUNCING: {Announced: frozenset({Phase.COUNTING})},
    Phase.COUNTING: {Counted: frozenset({Phase.SEALING, Phase.WAITING})},
    Phase.WAITING: {
        ResultSeen: _AFTER_RESULT,
        DeadlineReached: frozenset({Phase.SEALING, Phase.WITHDRAWING}),
    },
    Phase.SEALING: {
        Candidates: frozenset({Phase.PUBLISHING, Phase.WAITING, Phase.RECRUITING}),
    },
    Phase.PUBLISHING: {Published: _AFTER_RESULT},
    Phase.RECRUITING: {
        ResultSeen: _AFTER_RESULT,
        JoinsChanged: frozenset({Phase.SEALING}),
        DeadlineReached: frozenset({Phase.SEALING, Phase.WITHDRAWING}),
    },
    Phase.WITHDRAWING: {Withdrawn: frozenset({Phase.DONE, Phase.CLOSED, Phase.TIMED_OUT})},
}
"""For each phase, the events it accepts and the phases each may lead to."""


@dataclass(frozen=True, slots=True)
class RoundPolicy:
    """The bounds and timeouts the machine applies (seconds)."""

    min_nodes: int
    max_nodes: int
    join_timeout: float
    last_call_timeout: float


@dataclass(slots=True)
class JoinMachine:
    """One node's attempt to join a round (one call of ``next_rendezvous``).

    ``previous`` is the ``(round, rank)`` the node last completed, so it can keep its rank.
    """

    policy: RoundPolicy
    node: int
    addr: str
    port: int
    previous: tuple[int, int] = (0, -1)
    phase: Phase = Phase.READING
    round: int = 0
    arrival: int = 0
    join_deadline: float = math.inf
    last_call_deadline: float = math.inf
    result: RoundResult | None = None
    _started: bool = field(default=False, repr=False)

    def start(self, now: float) -> Command:
        """Begin joining at time ``now``; return the first command."""
        if self._started:
            raise RendezvousStateError("a JoinMachine joins once; create a new one to rejoin")
        self._started = True
        self.join_deadline = now + self.policy.join_timeout
        return ReadState()

    def send(self, event: Event, now: float) -> Command:
        """Feed the outcome of the last command at time ``now``; return the next command."""
        allowed = TRANSITIONS.get(self.phase, {}).get(type(event))
        if allowed is None or not self._started:
            raise RendezvousStateError(
                f"event {type(event).__name__} is not valid while {self.phase.value} "
                f"(node {self.node}, round {self.round})"
            )
        command = self._handle(event, now)
        if self.phase not in allowed:  # pragma: no cover - guards the table against the code
            raise AssertionError(f"{type(event).__name__} moved to {self.phase} not in {allowed}")
        return command

    @property
    def finished(self) -> bool:
        return self.phase in _TERMINAL

    # -- handlers ------------------------------------------------------------------------------

    def _handle(self, event: Event, now: float) -> Command:
        match event:
            case StateRead(latest, closed):
                if closed:
                    return self._fail(Phase.CLOSED)
                return self._announce(max(latest, self.previous[0]) + 1)
            case Announced():
                self.phase = Phase.COUNTING
                return Count(self.round)
            case Counted(arrival):
                self.arrival = arrival
                if arrival >= self.policy.min_nodes:
                    self.last_call_deadline = now + self.policy.last_call_timeout
                if arrival == self.policy.max_nodes:
                    self.phase = Phase.SEALING
                    return ReadCandidates(self.round)
                return self._wait()
            case ResultSeen(value) | Published(value):
                return self._on_result(value)
            case DeadlineReached():
                if now >= self.join_deadline:
                    self.phase = Phase.WITHDRAWING
                    return Withdraw(self.round, self.node)
                self.phase = Phase.SEALING
                return ReadCandidates(self.round)
            case JoinsChanged():
                self.phase = Phase.SEALING
                return ReadCandidates(self.round)
            case Candidates(records, alive):
                return self._on_candidates(records, alive, now)
            case Withdrawn(value, live):
                if value is not None and self._admits_me(value):
                    return self._on_result(value)
                return self._fail(Phase.TIMED_OUT, live)
        raise AssertionError(event)  # pragma: no cover - TRANSITIONS admits only the above

    def _announce(self, round_: int) -> Command:
        self.phase = Phase.ANNOUNCING
        self.round = round_
        self.arrival = 0
        self.last_call_deadline = math.inf
        prev_round, prev_rank = self.previous
        record = JoinRecord(self.node, self.addr, self.port, prev_round, prev_rank)
        return Announce(round_, record)

    def _wait(self) -> Command:
        self.phase = Phase.WAITING
        return AwaitResult(self.round, min(self.join_deadline, self.last_call_deadline))

    def _on_result(self, value: bytes) -> Command:
        if value == CLOSED_RESULT:
            return self._fail(Phase.CLOSED)
        result = RoundResult.decode(self.round, value)
        rank = result.rank_of(self.node)
        if rank is None:
            return self._announce(self.round + 1)
        self.phase = Phase.DONE
        self.result = result
        return Finish(result, rank)

    def _admits_me(self, value: bytes) -> bool:
        """Whether ``value`` ends the join: the job closed, or a result with this node in it."""
        if value == CLOSED_RESULT:
            return True
        return RoundResult.decode(self.round, value).rank_of(self.node) is not None

    def _on_candidates(
        self, records: Mapping[int, JoinRecord], alive: frozenset[int], now: float
    ) -> Command:
        live = [record for node, record in records.items() if node in alive]
        policy = self.policy
        if len(live) >= policy.max_nodes or (
            len(live) >= policy.min_nodes and now >= self.last_call_deadline
        ):
            self.phase = Phase.PUBLISHING
            return Publish(self.round, seal(self.round, live, policy.max_nodes).encode())
        if len(live) >= policy.min_nodes:
            if self.last_call_deadline == math.inf:
                self.last_call_deadline = now + policy.last_call_timeout
            return self._wait()
        self.last_call_deadline = math.inf
        self.phase = Phase.RECRUITING
        return AwaitJoins(self.round, self.join_deadline, frozenset(records.keys() - alive))

    def _fail(self, phase: Phase, live: int = 0) -> Command:
        self.phase = phase
        return Fail(phase, self.round, live)


# -- after a round: is it still valid? ---------------------------------------------------------


def assess_inbox(
    members: tuple[int, ...], round_: int, items: Mapping[str, bytes]
) -> RoundInvalidated | None:
    """Judge round ``round_`` from the keys of the next round (``items``, relative keys).

    Closed beats a lost participant, which beats nodes waiting to join.
    """
    head = round_prefix(round_ + 1)
    result = items.get(head + "result")
    if result == CLOSED_RESULT:
        return RoundInvalidated(
            InvalidationReason.CLOSED, f"the rendezvous was closed in round {round_}"
        )
    lost_head = head + "lost/"
    lost = sorted(
        int(key[len(lost_head) :])
        for key in items
        if key.startswith(lost_head) and int(key[len(lost_head) :]) in members
    )
    if lost:
        names = ", ".join(str(node) for node in lost)
        return RoundInvalidated(
            InvalidationReason.PARTICIPANT_LOST,
            f"participant node(s) {names} of round {round_} stopped heart-beating or left",
        )
    waiting = sum(1 for key in items if key.startswith(head + "join/"))
    if waiting:
        return RoundInvalidated(
            InvalidationReason.NODES_WAITING,
            f"{waiting} node(s) are waiting to join round {round_ + 1}",
        )
    if result is not None:
        return RoundInvalidated(
            InvalidationReason.NODES_WAITING, f"round {round_ + 1} completed without this node"
        )
    return None


def ring_successor(members: tuple[int, ...], node: int) -> int | None:
    """The member whose liveness ``node`` watches (the next in rank order), or None if alone."""
    if len(members) < 2:
        return None
    rank = members.index(node)
    return members[(rank + 1) % len(members)]
