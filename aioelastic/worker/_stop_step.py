"""Preemption's stop step: how every rank of a job stops at the same step. Pure: no I/O, no clock.

Theory of operation. One node's agent gets the notice (a signal, or a scheduler's notice file)
and writes it to the job's store; every agent watches that key and tells its workers. A
worker learns it at a step boundary (``world.should_stop(step)``, a non-blocking look at its
link, so a step without a notice costs no round trip). From then on the worker may not pass a
boundary on its own: it *asks* its agent (:class:`Gate`), and the agent *claims* ``step + 1``
for it in the store (the step it will reach next) before it answers "pass". Once every rank of
every node has claimed at least once, one agent *closes* the claims, reads them and publishes
the stop step ``S``: the highest claim (:func:`agreed_step`).

Why no rank is ever past ``S``: an agent answers "pass" only after writing the claim *and*
then seeing the claims still open; the closer reads the claims only after closing them. So a
claim that allowed a rank past step ``s`` is in the read (``S >= s + 1``), and a claim that
raced the closing is answered with ``S`` (the rank stops at once if it is at ``S``, and ``S``
is at least its previous claim, the boundary it is at). Why nothing deadlocks: a rank waits
only for ``S`` once the claims are closed, and only agents close and publish, never waiting on
a worker; a rank that has not seen the notice yet never waits for one that has, so collectives
in the user's step go on. The cost: one or two more steps than the earliest common boundary.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

from aioelastic.worker._protocol import Lines, LinkProtocolError


class GateState(enum.Enum):
    """Where one rank's gate stands."""

    OPEN = "open"
    """No notice: every boundary passes."""
    ASKING = "asking"
    """The job is preempted and the stop step is not known: each boundary asks the agent."""
    KNOWN = "known"
    """The stop step is known: the rank passes boundaries until it reaches it."""


class Verdict(enum.Enum):
    """What a rank does at a boundary."""

    PASS = "pass"
    ASK = "ask"
    STOP = "stop"


@dataclass(slots=True)
class Gate:
    """One rank's view: :meth:`at` says what to do at a boundary, fed by what the agent said."""

    state: GateState = GateState.OPEN
    stop_step: int | None = None
    reached: int | None = None
    """The highest boundary this rank reported reaching (None before the first)."""

    def noticed(self) -> None:
        """The agent said the job is preempted."""
        if self.state is GateState.OPEN:
            self.state = GateState.ASKING

    def stop_at(self, step: int) -> None:
        """The agent said the job stops at ``step``."""
        self.state, self.stop_step = GateState.KNOWN, step

    def at(self, step: int) -> Verdict:
        """The verdict at boundary ``step``: ASK means ask the agent, then :meth:`answered`."""
        self.reached = step if self.reached is None else max(self.reached, step)
        if self.state is GateState.OPEN:
            return Verdict.PASS
        if self.state is GateState.ASKING:
            return Verdict.ASK
        assert self.stop_step is not None
        return Verdict.STOP if step >= self.stop_step else Verdict.PASS

    def answered(self, step: int, stop_step: int | None) -> Verdict:
        """The agent's answer to an ask at ``step``: pass (None), or the stop step."""
        if stop_step is None:
            return Verdict.PASS
        self.stop_at(stop_step)
        return self.at(step)


@dataclass(slots=True)
class NodeClaims:
    """An agent's book of its ranks' claims during one preemption.

    ``waiting`` are the local ranks that must claim before the node is ready (those on the
    worker API when the notice came and still running); a rank that exits or claims leaves it.
    """

    waiting: set[int] = field(default_factory=set)
    claims: dict[int, int] = field(default_factory=dict)
    """Rank -> the highest step it was allowed to reach."""
    announced: bool = False
    """The node told the store it is ready (it does so once)."""

    def claim(self, rank: int, step: int) -> int | None:
        """Rank ``rank`` asks to pass ``step``: the node's new claim to write (the highest step
        any of its ranks may reach) if it rose, else None."""
        before = self.node_claim
        self.claims[rank] = max(self.claims.get(rank, step + 1), step + 1)
        self.waiting.discard(rank)
        after = self.node_claim
        return after if after != before else None

    def gone(self, rank: int) -> None:
        """Rank ``rank`` exited: the node no longer waits for its claim."""
        self.waiting.discard(rank)

    @property
    def node_claim(self) -> int | None:
        """The highest step any local rank may reach (None: none claimed)."""
        return max(self.claims.values(), default=None)

    def ready_to_announce(self) -> bool:
        """True once (the first time every waited-for rank has claimed or gone)."""
        if self.announced or self.waiting:
            return False
        self.announced = True
        return True


def agreed_step(claims: Iterable[int | None]) -> int | None:
    """The job's stop step from every node's claim: the highest (None: no rank on the API)."""
    return max((c for c in claims if c is not None), default=None)


def encode_claim(claim: int | None) -> bytes:
    """A node's claim as stored (``none`` where no rank claimed)."""
    return b"none" if claim is None else str(claim).encode()


def decode_claim(raw: bytes) -> int | None:
    """The inverse of :func:`encode_claim`."""
    return None if raw == b"none" else int(raw)


# -- the preemption link: one JSON object a line, beside the in-place link -------------------

PREEMPT_SOCKET_ENV = "AIOELASTIC_PREEMPT_SOCKET"
"""The environment variable naming the agent's preemption socket (a UNIX socket path)."""


@dataclass(frozen=True, slots=True)
class Join:
    """Worker -> agent: this process (``rank`` of the job) is on the worker API."""

    pid: int
    rank: int


@dataclass(frozen=True, slots=True)
class Ask:
    """Worker -> agent: the job is preempted; may this rank pass boundary ``step``?"""

    step: int


@dataclass(frozen=True, slots=True)
class Stopping:
    """Worker -> agent: ``should_stop(step)`` said True; the rank saves and returns."""

    step: int


@dataclass(frozen=True, slots=True)
class Notice:
    """Agent -> worker: the job is preempted (by node ``node``, ``deadline_in`` s left)."""

    node: int
    deadline_in: float


@dataclass(frozen=True, slots=True)
class Answer:
    """Agent -> worker: the answer to :class:`Ask` at ``step``: pass (``stop_step`` None)."""

    step: int
    stop_step: int | None


@dataclass(frozen=True, slots=True)
class StopAt:
    """Agent -> worker: the job stops at ``stop_step``."""

    stop_step: int


PreemptMessage = Join | Ask | Stopping | Notice | Answer | StopAt

_MESSAGES: dict[str, type[PreemptMessage]] = {
    cls.__name__: cls for cls in (Join, Ask, Stopping, Notice, Answer, StopAt)
}


def encode_message(message: PreemptMessage) -> bytes:
    """One line: ``{"kind": ..., fields...}`` and a newline."""
    return json.dumps({"kind": type(message).__name__, **asdict(message)}).encode() + b"\n"


def decode_message(line: bytes) -> PreemptMessage:
    """Parse a line of :func:`encode_message`; raise :class:`LinkProtocolError`."""
    try:
        data = json.loads(line)
        cls = _MESSAGES[data.pop("kind")]
        return cls(**{f.name: data[f.name] for f in fields(cls)})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LinkProtocolError(f"not a message of the preemption link: {line[:80]!r}") from exc


class PreemptLines(Lines[PreemptMessage]):
    """Splits the preemption link's bytes into messages."""

    def __init__(self) -> None:
        super().__init__(decode_message)
