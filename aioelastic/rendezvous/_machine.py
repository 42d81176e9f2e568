"""The elastic rendezvous protocol: a pure state machine (no I/O, no clock; ``now`` is passed in).

Theory of operation. Rounds are numbered 1, 2, ...; a node joins the round after the last
sealed one (``state/latest``, which only moves forward), or after the last round it completed
itself if that is later: the sealer that advances ``state/latest`` may have died first. It
*arrives*: writes its join record and takes an arrival number ``i``, in one of two ways, by what
the store offers (:class:`Arrive`): on a store with an atomic add (memory, TCP) it then adds 1
to the round's arrival counter, and ``i`` is the sum; on a store that counts keys as it writes
(etcd, which has no atomic add: N nodes adding to one counter would conflict and retry O(N)
times each) ``i`` is the number of join records in the round once its own is written, in the
same atomic step. Either way at least ``i`` records were written before ``i`` was taken, and
the number grows by one per arrival, so the first arrival to bring it to ``k`` gets exactly
``k``; only the counter's numbers are distinct (a withdrawn record lowers the key count, so a
later node may take a number again), and nothing below relies on that. Every node of a run
arrives the same way, since the store decides. On a store that counts keys, the arrival also
reads ``state/`` in the same atomic step instead of before it (one round trip fewer): the node
arrives at the round after the last one it knows of, and if that step shows the run closed, or
a later round sealed, it arrives again at the round after that (its record in a sealed round is
one more late arrival there, which no one waits for). Nobody watches the arrivals except in
the rare recovery case below;
each joined node waits for one key, the round's *result*, which is written once with
compare-and-set, so every node of a round reads the same sealed outcome:

* a node with ``i == max_nodes`` seals at once (if ``max_nodes`` joined nodes are alive);
* the node with ``i == min_nodes`` seals ``last_call_timeout`` after its arrival; a node with
  ``i > min_nodes`` knows that ``min_nodes`` had arrived before it, so it arms the same timer
  as a fallback (in case the earlier sealer died); the first one due wins the compare-and-set;
* a sealer reads the join records and the nodes' liveness keys (TTL keys refreshed by each
  node, expired by the store's clock) and seals the live joiners, previous members first, at
  most ``max_nodes``; with fewer than ``min_nodes`` alive it waits for more joins instead,
  watching the round from the store revision of its read;
* a node that finds a result without itself (it came late, or the round was full) joins the
  next round, where it is a *waiting node*; a result saying ``closed`` ends the job;
* a node that reaches ``join_timeout`` withdraws its record, then reads the result once more
  (it may have been sealed in meanwhile) before reporting a timeout.

Each node does a constant number of store operations per round, so a round costs O(N) in total.
Ranks: a member of the previous round keeps its rank when that rank is below the new world
size; the others fill the free ranks (previous members first, then by node id): ranks do not
depend on arrival numbers.

After a round completes, the keys of the next round are its *inbox* (:func:`assess_inbox`): a
join record there means nodes are waiting, a *lost* mark that a member is gone (written by the
member itself when it leaves, or by its ring predecessor, :func:`ring_successor`, once its
liveness key expired), and a ``closed`` result that the job is over. The next round's arrival
counter doubles as the inbox's doorbell, so members wait for one key, not for a prefix: every
arrival writes it (the add, or a plain write beside the counted join record), and so does every
loss report and the close.

The machine is driven by :meth:`JoinMachine.send`: it takes an :class:`Event` (the outcome of
the previous :class:`Command`), records what the event says, then walks the entry of
:data:`TRANSITIONS` for its phase and that event: ordered (guard, next phase) pairs whose
guards are named predicates over the machine. The first guard that holds picks the next phase,
and entering a phase issues that phase's command. The two store protocols that are loops of
compare-and-sets, advancing ``state/latest`` and closing the run, are pure steps here too
(:class:`AdvanceLatest`, :class:`CloseRound`), which the shell runs until one says it is done.
The key layout and the records are in :mod:`._layout`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, Self

from aioelastic.rendezvous._errors import RendezvousUsageError
from aioelastic.rendezvous._info import InvalidationReason, RoundInvalidated
from aioelastic.rendezvous._layout import (
    CLOSED_RESULT,
    LATEST_KEY,
    JoinRecord,
    Members,
    RoundResult,
    result_key,
    round_prefix,
)


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


def live_joiners(records: Mapping[int, JoinRecord], alive: frozenset[int]) -> list[JoinRecord]:
    """The join records of nodes whose liveness key is there: what a sealer may seal, and what
    a node that timed out reports as joined."""
    return [record for node, record in records.items() if node in alive]


# -- the join state machine --------------------------------------------------------------------


class Phase(enum.Enum):
    """Where a node is in joining a round."""

    READING = "reading the run's state"
    ARRIVING = "writing the join record and taking an arrival number"
    WAITING = "waiting for the round's result"
    SEALING = "reading the candidates"
    PUBLISHING = "publishing the result"
    RECRUITING = "waiting for more live nodes"
    WITHDRAWING = "withdrawing after the join timeout"
    DONE = "joined"
    CLOSED = "closed"
    TIMED_OUT = "timed out"


class FailReason(enum.Enum):
    """Why a join ended without a round (:class:`Fail`)."""

    CLOSED = "the rendezvous is closed"
    TIMED_OUT = "the join timed out"


# Events: the outcome of the previous command.


@dataclass(frozen=True, slots=True)
class StateRead:
    latest: int
    closed: bool


@dataclass(frozen=True, slots=True)
class Arrived:
    arrival: int
    state: StateRead | None = None
    """``state/`` as read in the arrival's own atomic step, when the arrival read it."""


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
    revision: int = 0
    """The store revision of the join records' read: a later wait for joins starts there."""


@dataclass(frozen=True, slots=True)
class Published:
    value: bytes


@dataclass(frozen=True, slots=True)
class Withdrawn:
    value: bytes | None
    """The round's result if it was sealed meanwhile."""
    live: int
    """Live nodes joined to the round (this one included) when the node withdrew
    (:func:`live_joiners`)."""


Event = (
    StateRead
    | Arrived
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
class Arrive:
    """Write the join record and take an arrival number -> :class:`Arrived`: on a store with
    an atomic add, write the record, then add 1 to the round's counter (the sum); on a store
    that counts keys as it writes, :func:`~._layout.counted_arrival` (the count)."""

    round: int
    record: JoinRecord
    read_state: bool = False
    """Also read ``state/`` in the same atomic step -> :attr:`Arrived.state` (a store that
    counts keys as it writes: ``Store.multi_set_count_and_read``)."""


@dataclass(frozen=True, slots=True)
class AwaitResult:
    """Wait for the round's result -> :class:`ResultSeen`, or :class:`DeadlineReached`."""

    round: int
    deadline: float


@dataclass(frozen=True, slots=True)
class ReadCandidates:
    """Read the round's join records (noting the revision) and the liveness keys ->
    :class:`Candidates`."""

    round: int


@dataclass(frozen=True, slots=True)
class Publish:
    """Compare-and-set the result from empty; if it was stored, advance ``state/latest`` to
    ``round`` (:class:`AdvanceLatest`).

    -> :class:`Published` with the value now stored (ours or an earlier one).
    """

    round: int
    value: bytes


@dataclass(frozen=True, slots=True)
class AwaitJoins:
    """Wait for any change in the round after store revision ``after``, or for the liveness
    key of a ``lapsed`` joiner to come back -> :class:`ResultSeen` if the result exists, else
    :class:`JoinsChanged`; or :class:`DeadlineReached`."""

    round: int
    deadline: float
    lapsed: frozenset[int] = frozenset()
    """Joined nodes whose liveness key was missing (e.g. stopped, then resumed, processes)."""
    after: int = 0
    """The revision of the candidates' read: a join since then is a change."""


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Count live joiners (:func:`live_joiners`), delete the join record, read the result ->
    :class:`Withdrawn`."""

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

    reason: FailReason
    round: int
    live: int = 0


Command = (
    ReadState
    | Arrive
    | AwaitResult
    | ReadCandidates
    | Publish
    | AwaitJoins
    | Withdraw
    | Finish
    | Fail
)


@dataclass(frozen=True, slots=True)
class RoundPolicy:
    """The bounds and timeouts the machine applies (seconds)."""

    min_nodes: int
    max_nodes: int
    join_timeout: float
    last_call_timeout: float


# -- the transition table ----------------------------------------------------------------------

Guard = Callable[["JoinMachine", float], bool]
"""A named predicate over the machine (after it recorded the event) at time ``now``."""


def otherwise(machine: JoinMachine, now: float) -> bool:
    """Always: the last entry of a transition."""
    return True


def run_closed(machine: JoinMachine, now: float) -> bool:
    """The run is closed (``state/closed`` is set, or a result says ``closed``)."""
    return machine.closed


def admitted(machine: JoinMachine, now: float) -> bool:
    """The round's result was read and this node is a member."""
    return machine.rank is not None


def round_passed(machine: JoinMachine, now: float) -> bool:
    """The arrival's own read of ``state/`` shows this round (or a later one) sealed."""
    return machine.latest >= machine.round


def house_full(machine: JoinMachine, now: float) -> bool:
    """This node is the ``max_nodes``-th arrival: it seals at once."""
    return machine.arrival == machine.policy.max_nodes


def join_timed_out(machine: JoinMachine, now: float) -> bool:
    """``join_timeout`` has passed since the node started joining."""
    return now >= machine.join_deadline


def round_sealable(machine: JoinMachine, now: float) -> bool:
    """``max_nodes`` live joiners, or ``min_nodes`` of them and the last call is over."""
    live, policy = len(machine.live), machine.policy
    return live >= policy.max_nodes or (
        live >= policy.min_nodes and now >= machine.last_call_deadline
    )


def quorum(machine: JoinMachine, now: float) -> bool:
    """At least ``min_nodes`` live joiners in the last candidates' read."""
    return len(machine.live) >= machine.policy.min_nodes


Transition = tuple[tuple[Guard, Phase], ...]

_AFTER_RESULT: Transition = (
    (run_closed, Phase.CLOSED),
    (admitted, Phase.DONE),
    (otherwise, Phase.ARRIVING),  # sealed without this node: join the next round
)
_AT_DEADLINE: Transition = ((join_timed_out, Phase.WITHDRAWING), (otherwise, Phase.SEALING))

TRANSITIONS: Mapping[Phase, Mapping[type[Event], Transition]] = {
    Phase.READING: {StateRead: ((run_closed, Phase.CLOSED), (otherwise, Phase.ARRIVING))},
    Phase.ARRIVING: {
        Arrived: (
            (run_closed, Phase.CLOSED),
            (round_passed, Phase.ARRIVING),  # arrived late: the next round
            (house_full, Phase.SEALING),
            (otherwise, Phase.WAITING),
        )
    },
    Phase.WAITING: {ResultSeen: _AFTER_RESULT, DeadlineReached: _AT_DEADLINE},
    Phase.SEALING: {
        Candidates: (
            (round_sealable, Phase.PUBLISHING),
            (quorum, Phase.WAITING),  # for the last call
            (otherwise, Phase.RECRUITING),
        ),
    },
    Phase.PUBLISHING: {Published: _AFTER_RESULT},
    Phase.RECRUITING: {
        ResultSeen: _AFTER_RESULT,
        JoinsChanged: ((otherwise, Phase.SEALING),),
        DeadlineReached: _AT_DEADLINE,
    },
    Phase.WITHDRAWING: {
        Withdrawn: (
            (run_closed, Phase.CLOSED),
            (admitted, Phase.DONE),  # sealed with this node just before it withdrew
            (otherwise, Phase.TIMED_OUT),
        ),
    },
}
"""For each phase, the events it accepts and, for each, ordered (guard, next phase) pairs."""

_TERMINAL = frozenset({Phase.DONE, Phase.CLOSED, Phase.TIMED_OUT})


@dataclass(slots=True)
class JoinMachine:
    """One node's attempt to join a round (one call of ``next_rendezvous``).

    ``previous`` is the ``(round, rank)`` the node last completed, so it can keep its rank.
    ``read_state_on_arrival``: the store counts keys as it writes, so the machine arrives at
    once, reading ``state/`` in the arrival's step, instead of reading it first.
    """

    policy: RoundPolicy
    node: int
    addr: str
    port: int
    previous: tuple[int, int] = (0, -1)
    read_state_on_arrival: bool = False
    phase: Phase = Phase.READING
    round: int = 0
    arrival: int = 0
    join_deadline: float = math.inf
    last_call_deadline: float = math.inf
    result: RoundResult | None = None
    latest: int = 0
    """The last round known sealed: the node joins the one after."""
    closed: bool = False
    sealed: RoundResult | None = field(default=None, repr=False)
    """The round's result as last read (with or without this node)."""
    rank: int | None = None
    """This node's rank in :attr:`sealed`, or None."""
    live: list[JoinRecord] = field(default_factory=list, repr=False)
    """The live joiners of the last candidates' read."""
    lapsed: frozenset[int] = field(default=frozenset(), repr=False)
    """The joiners of that read whose liveness key was missing."""
    watch_from: int = 0
    """The store revision of that read."""
    live_at_withdraw: int = 0
    _started: bool = field(default=False, repr=False)

    def start(self, now: float) -> Command:
        """Begin joining at time ``now``; return the first command."""
        if self._started:
            raise RendezvousUsageError("a JoinMachine joins once; create a new one to rejoin")
        self._started = True
        self.join_deadline = now + self.policy.join_timeout
        if self.read_state_on_arrival:
            self.latest = self.previous[0]
            self.phase = Phase.ARRIVING
            return self._arrive(now)
        return ReadState()

    def send(self, event: Event, now: float) -> Command:
        """Feed the outcome of the last command at time ``now``; return the next command."""
        transition = TRANSITIONS.get(self.phase, {}).get(type(event))
        if transition is None or not self._started:
            raise RendezvousUsageError(
                f"event {type(event).__name__} is not valid while {self.phase.value} "
                f"(node {self.node}, round {self.round})"
            )
        self._record(event, now)
        return self._handle(transition, now)

    @property
    def finished(self) -> bool:
        return self.phase in _TERMINAL

    @property
    def may_hold_join_record(self) -> bool:
        """Whether a join abandoned now may leave this node's join record in the round (its
        write may be in flight): the shell withdraws it, best effort."""
        return self.phase is not Phase.READING and self.phase not in _TERMINAL

    # -- one step: record the event, walk the table, enter the phase -------------------------

    def _record(self, event: Event, now: float) -> None:
        """Note what ``event`` says, for the guards and the next command."""
        match event:
            case StateRead(latest, closed):
                self.latest = max(latest, self.previous[0])
                self.closed = closed
            case Arrived(arrival, state):
                if state is not None:
                    self.latest = max(self.latest, state.latest)
                    self.closed = state.closed
                self.arrival = arrival
                if arrival >= self.policy.min_nodes:  # min_nodes are in: the last call starts
                    self.last_call_deadline = now + self.policy.last_call_timeout
            case ResultSeen(value) | Published(value):
                self._read_result(value)
            case Withdrawn(value, live):
                self.live_at_withdraw = live
                if value is not None:
                    self._read_result(value)
            case Candidates(records, alive, revision):
                self.live = live_joiners(records, alive)
                self.lapsed = frozenset(records.keys() - alive)
                self.watch_from = revision
            case DeadlineReached() | JoinsChanged():
                pass

    def _read_result(self, value: bytes) -> None:
        if value == CLOSED_RESULT:
            self.closed = True
            return
        self.sealed = RoundResult.decode(self.round, value)
        self.rank = self.sealed.rank_of(self.node)
        self.latest = self.round

    def _handle(self, transition: Transition, now: float) -> Command:
        for guard, phase in transition:
            if guard(self, now):
                self.phase = phase
                return _ENTER[phase](self, now)
        raise AssertionError(transition)  # pragma: no cover - each transition ends `otherwise`

    def _arrive(self, now: float) -> Command:
        self.round = self.latest + 1
        self.arrival = 0
        self.last_call_deadline = math.inf
        self.sealed = self.rank = None
        self.live = []
        prev_round, prev_rank = self.previous
        record = JoinRecord(self.node, self.addr, self.port, prev_round, prev_rank)
        return Arrive(self.round, record, self.read_state_on_arrival)

    def _wait(self, now: float) -> Command:
        if self.last_call_deadline == math.inf and quorum(self, now):
            self.last_call_deadline = now + self.policy.last_call_timeout
        return AwaitResult(self.round, min(self.join_deadline, self.last_call_deadline))

    def _read_candidates(self, now: float) -> Command:
        return ReadCandidates(self.round)

    def _publish(self, now: float) -> Command:
        return Publish(self.round, seal(self.round, self.live, self.policy.max_nodes).encode())

    def _recruit(self, now: float) -> Command:
        self.last_call_deadline = math.inf
        return AwaitJoins(self.round, self.join_deadline, self.lapsed, self.watch_from)

    def _withdraw(self, now: float) -> Command:
        return Withdraw(self.round, self.node)

    def _finish(self, now: float) -> Command:
        assert self.sealed is not None  # the `admitted` guard held
        assert self.rank is not None
        self.result = self.sealed
        return Finish(self.sealed, self.rank)

    def _closed(self, now: float) -> Command:
        return Fail(FailReason.CLOSED, self.round)

    def _timed_out(self, now: float) -> Command:
        return Fail(FailReason.TIMED_OUT, self.round, self.live_at_withdraw)


_ENTER: Mapping[Phase, Callable[[JoinMachine, float], Command]] = {
    Phase.ARRIVING: JoinMachine._arrive,
    Phase.WAITING: JoinMachine._wait,
    Phase.SEALING: JoinMachine._read_candidates,
    Phase.PUBLISHING: JoinMachine._publish,
    Phase.RECRUITING: JoinMachine._recruit,
    Phase.WITHDRAWING: JoinMachine._withdraw,
    Phase.DONE: JoinMachine._finish,
    Phase.CLOSED: JoinMachine._closed,
    Phase.TIMED_OUT: JoinMachine._timed_out,
}
"""What entering each phase asks the shell to do."""


# -- compare-and-set loops: advancing state/latest, closing the run -----------------------------


class CompareSetStep(Protocol):
    """One compare-and-set of a loop; :meth:`then` reads its outcome."""

    @property
    def key(self) -> str: ...
    @property
    def expected(self) -> bytes: ...
    @property
    def desired(self) -> bytes: ...
    def then(self, stored: bytes) -> Self | None:
        """The next step after this one's compare-and-set returned ``stored``, or None: done."""
        ...


@dataclass(frozen=True, slots=True)
class AdvanceLatest:
    """A step of moving ``state/latest`` forward to ``round``, never back: a sealer stopped
    (SIGSTOP) after it sealed a round may publish it after later rounds were sealed."""

    round: int
    expected: bytes

    @classmethod
    def first(cls, round_: int) -> AdvanceLatest:
        """Expect the round before: one compare-and-set, usually."""
        return cls(round_, str(round_ - 1).encode() if round_ > 1 else b"")

    @property
    def key(self) -> str:
        return LATEST_KEY

    @property
    def desired(self) -> bytes:
        return str(self.round).encode()

    def then(self, stored: bytes) -> AdvanceLatest | None:
        """Done once ``state/latest`` is ``round`` or beyond; else expect what is stored."""
        if stored == self.expected:  # the key is missing: nothing was compared
            return AdvanceLatest(self.round, b"")
        if stored == self.desired or int(stored) > self.round:
            return None
        return AdvanceLatest(self.round, stored)


@dataclass(frozen=True, slots=True)
class CloseRound:
    """A step of closing the run: the ``closed`` marker goes into the result of the first round
    from ``round`` (the one after ``state/latest``) that has none, so no round after can form.
    Once it is stored, ring that round's doorbell: the last round's members learn of it."""

    round: int

    @property
    def key(self) -> str:
        return result_key(self.round)

    @property
    def expected(self) -> bytes:
        return b""

    @property
    def desired(self) -> bytes:
        return CLOSED_RESULT

    def then(self, stored: bytes) -> CloseRound | None:
        """Done if the marker is stored here (by this node or another closer); else try the
        next round (this one was sealed)."""
        return None if stored == CLOSED_RESULT else CloseRound(self.round + 1)


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
