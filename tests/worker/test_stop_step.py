"""The stop-step agreement (``aioelastic/worker/_stop_step.py``): unit rules, and a model of the
whole job (ranks, agents, a store) run under every interleaving hypothesis finds."""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioelastic.worker import _preemption
from aioelastic.worker._protocol import LinkProtocolError
from aioelastic.worker._stop_step import (
    PREEMPT_SOCKET_ENV,
    Answer,
    Ask,
    Gate,
    GateState,
    Join,
    NodeClaims,
    Notice,
    StopAt,
    Stopping,
    Verdict,
    agreed_step,
    decode_claim,
    decode_message,
    encode_claim,
    encode_message,
)

# -- the rules one at a time ----------------------------------------------------------------


def test_an_open_gate_passes_every_boundary() -> None:
    """Without a notice every boundary passes, whatever the step."""
    gate = Gate()
    assert [gate.at(step) for step in (0, 5, 3)] == [Verdict.PASS] * 3
    assert gate.reached == 5


def test_a_noticed_gate_asks_until_it_knows_the_stop_step() -> None:
    """After the notice a rank asks at each boundary; an answer with the stop step settles it."""
    gate = Gate()
    gate.noticed()
    assert gate.at(4) is Verdict.ASK
    assert gate.answered(4, None) is Verdict.PASS
    assert gate.at(5) is Verdict.ASK
    assert gate.answered(5, 6) is Verdict.PASS
    assert gate.state is GateState.KNOWN
    assert gate.at(6) is Verdict.STOP


def test_an_answer_naming_this_step_stops_at_once() -> None:
    """A rank whose ask raced the closing is told the stop step, which may be where it is."""
    gate = Gate()
    gate.noticed()
    assert gate.at(7) is Verdict.ASK
    assert gate.answered(7, 7) is Verdict.STOP


def test_a_notice_after_the_stop_step_changes_nothing() -> None:
    """The stop step, once known, is not forgotten by a late notice."""
    gate = Gate()
    gate.stop_at(3)
    gate.noticed()
    assert (gate.at(2), gate.at(3)) == (Verdict.PASS, Verdict.STOP)


def test_a_node_claims_the_highest_next_step_of_its_ranks() -> None:
    """A claim is the step after the boundary; the node's claim rises only when it must."""
    claims = NodeClaims(waiting={0, 1})
    assert claims.claim(0, 4) == 5
    assert claims.claim(1, 3) is None
    assert claims.claim(1, 5) == 6
    assert claims.node_claim == 6


def test_a_node_is_ready_once_every_rank_claimed_or_left() -> None:
    """Readiness is announced once: after every waited-for rank claimed or exited."""
    claims = NodeClaims(waiting={0, 1})
    claims.claim(0, 1)
    assert not claims.ready_to_announce()
    claims.gone(1)
    assert claims.ready_to_announce()
    assert not claims.ready_to_announce()


def test_the_stop_step_is_the_highest_claim() -> None:
    """Nodes without a rank on the API do not count; no claim at all agrees on nothing."""
    assert agreed_step([3, None, 5]) == 5
    assert agreed_step([None, None]) is None


@given(st.one_of(st.none(), st.integers(0, 2**62)))
def test_a_claim_survives_the_store(claim: int | None) -> None:
    """A node's claim reads back as written."""
    assert decode_claim(encode_claim(claim)) == claim


@given(
    st.one_of(
        st.builds(Join, st.integers(1, 2**22), st.integers(0, 4096)),
        st.builds(Ask, st.integers(0, 2**40)),
        st.builds(Stopping, st.integers(0, 2**40)),
        st.builds(Notice, st.integers(0, 4096), st.floats(0, 1e6)),
        st.builds(Answer, st.integers(0, 2**40), st.one_of(st.none(), st.integers(0, 2**40))),
        st.builds(StopAt, st.integers(0, 2**40)),
    )
)
def test_a_message_survives_the_link(message: Join | Ask | Stopping | Notice | Answer) -> None:
    """Every message of the preemption link decodes to itself."""
    assert decode_message(encode_message(message).rstrip(b"\n")) == message


@pytest.mark.parametrize("line", [b"{}", b'{"kind": "Ask"}', b"nonsense", b'{"kind": "Hello"}'])
def test_a_foreign_line_is_refused(line: bytes) -> None:
    """A line that is not a message of this link says so."""
    with pytest.raises(LinkProtocolError, match="not a message of the preemption link"):
        decode_message(line)


# -- the whole job, every interleaving ------------------------------------------------------


@dataclass(slots=True)
class _Rank:
    node: int
    gate: Gate = field(default_factory=Gate)
    boundary: int = 0
    running: bool = False
    """In the step after ``boundary`` (it passed it)."""
    asking: bool = False
    stopped: bool = False
    answer: tuple[int | None] | None = None
    highest: int = 0
    told: bool = False


@dataclass(slots=True)
class _Agent:
    """One agent: what it does is a queue of atomic store operations, run one per move."""

    node: int
    claims: NodeClaims = field(default_factory=NodeClaims)
    noticed: bool = False
    program: list[Callable[[], bool]] = field(default_factory=list)
    """Each entry runs one store operation; False: it cannot run yet (it waits on the store)."""
    asks: list[tuple[int, int]] = field(default_factory=list)


class _Job:
    """Ranks on nodes, each node's agent and one linearizable store, moved one atomic step at a
    time. ``lockstep``: each step ends in a collective, so a rank finishes step ``b`` only once
    every rank has passed boundary ``b``."""

    def __init__(self, ranks_per_node: list[int], *, lockstep: bool) -> None:
        self.store: dict[str, int | None] = {}
        self.ready = 0
        self.nodes = len(ranks_per_node)
        self.ranks = [_Rank(n) for n, count in enumerate(ranks_per_node) for _ in range(count)]
        self.agents = [_Agent(n) for n in range(self.nodes)]
        self.lockstep = lockstep
        self.noticed_at: dict[int, int] = {}

    # the moves that may happen now, each a (name, action)
    def moves(self, notice_allowed: bool) -> list[tuple[str, Callable[[], None]]]:
        moves: list[tuple[str, Callable[[], None]]] = []
        if notice_allowed and "notice" not in self.store:
            moves.append(("notice", self._notice))
        for agent in self.agents:
            if "notice" in self.store and not agent.noticed:
                moves.append((f"agent {agent.node} sees the notice", lambda a=agent: self._see(a)))
            if agent.program:
                moves.append((f"agent {agent.node} store op", lambda a=agent: self._run(a)))
            elif agent.asks:
                moves.append((f"agent {agent.node} takes an ask", lambda a=agent: self._take(a)))
        for index, rank in enumerate(self.ranks):
            if rank.stopped:
                continue
            agent = self.agents[rank.node]
            if agent.noticed and not rank.told:
                moves.append((f"rank {index} told", lambda r=rank: self._tell(r)))
            if rank.gate.state is not GateState.KNOWN and "stop" in self.store and rank.told:
                moves.append((f"rank {index} stop pushed", lambda r=rank: self._push(r)))
            if rank.asking:
                if rank.answer is not None:
                    moves.append((f"rank {index} answered", lambda r=rank: self._answered(r)))
            elif rank.running:
                if self._may_finish(rank):
                    moves.append((f"rank {index} finishes a step", lambda r=rank: self._step(r)))
            else:
                moves.append((f"rank {index} at boundary", lambda i=index, r=rank: self._at(i, r)))
        return moves

    def _notice(self) -> None:
        self.store["notice"] = 1
        self.noticed_at = {i: r.boundary for i, r in enumerate(self.ranks)}

    def _see(self, agent: _Agent) -> None:
        agent.noticed = True
        agent.claims.waiting = {i for i, r in enumerate(self.ranks) if r.node == agent.node}

    def _tell(self, rank: _Rank) -> None:
        rank.told = True
        rank.gate.noticed()

    def _push(self, rank: _Rank) -> None:
        stop = self.store["stop"]
        assert stop is not None
        rank.gate.stop_at(stop)

    def _may_finish(self, rank: _Rank) -> bool:
        if not self.lockstep:
            return True
        return all(
            other.boundary > rank.boundary or (other.boundary == rank.boundary and other.running)
            for other in self.ranks
        )

    def _step(self, rank: _Rank) -> None:
        rank.running = False
        rank.boundary += 1
        rank.highest = max(rank.highest, rank.boundary)

    def _at(self, index: int, rank: _Rank) -> None:
        verdict = rank.gate.at(rank.boundary)
        if verdict is Verdict.PASS:
            rank.running = True
        elif verdict is Verdict.STOP:
            rank.stopped = True
        else:
            rank.asking, rank.answer = True, None
            self.agents[rank.node].asks.append((index, rank.boundary))

    def _answered(self, rank: _Rank) -> None:
        assert rank.answer is not None
        verdict = rank.gate.answered(rank.boundary, rank.answer[0])
        rank.asking, rank.answer = False, None
        rank.running = verdict is Verdict.PASS
        rank.stopped = verdict is Verdict.STOP

    # the agent's program for one ask, as the shell runs it (each entry one store operation)
    def _take(self, agent: _Agent) -> None:
        index, step = agent.asks.pop(0)
        rank = self.ranks[index]
        claim_key = f"claim/{agent.node}"

        def claim() -> bool:
            rose = agent.claims.claim(index, step)
            if rose is not None:
                self.store[claim_key] = rose
            if agent.claims.ready_to_announce():
                agent.program.insert(1, announce)
            return True

        def announce() -> bool:
            self.store[claim_key] = agent.claims.node_claim
            self.ready += 1
            if self.ready == self.nodes:
                agent.program[1:1] = [close, publish]
            return True

        def close() -> bool:
            self.store["closed"] = 1
            return True

        def publish() -> bool:  # one read of every claim, then one write
            keys = [f"claim/{node}" for node in range(self.nodes)]
            self.store["stop"] = agreed_step(self.store.get(key) for key in keys)
            return True

        def check() -> bool:
            if "closed" not in self.store:
                rank.answer = (None,)
            else:
                agent.program.insert(1, wait_stop)
            return True

        def wait_stop() -> bool:
            if "stop" not in self.store:
                return False
            rank.answer = (self.store["stop"],)
            return True

        agent.program.extend([claim, check])

    def _run(self, agent: _Agent) -> None:
        if agent.program[0]():
            agent.program.pop(0)


def _runs(job: _Job, choose: Callable[[int], int], notice_after: int) -> None:
    """Move ``job`` with ``choose`` picking among the moves, then fairly, until nothing moves."""
    for count in itertools.count():
        moves = job.moves(notice_allowed=count >= notice_after)
        if "notice" not in job.store and count >= notice_after:
            moves = [m for m in moves if m[0] == "notice"]
        runnable = [m for m in moves if not _waits(job, m)]
        if not runnable:
            return
        if count > 20_000:
            raise AssertionError(f"the job never stopped: {[m[0] for m in runnable]}")
        pick = choose(len(runnable)) if count < 400 else count % len(runnable)
        runnable[pick][1]()


def _waits(job: _Job, move: tuple[str, Callable[[], None]]) -> bool:
    """A store op that cannot run yet (waiting for the stop step) is no move."""
    name = move[0]
    if not name.endswith("store op"):
        return False
    agent = job.agents[int(name.split()[1])]
    return agent.program[0].__name__ == "wait_stop" and "stop" not in job.store


@settings(max_examples=300, deadline=None)
@given(
    ranks_per_node=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    lockstep=st.booleans(),
    notice_after=st.integers(0, 60),
    data=st.data(),
)
def test_every_rank_stops_at_one_step_that_none_has_passed(
    ranks_per_node: list[int], lockstep: bool, notice_after: int, data: st.DataObject
) -> None:
    """Under any interleaving: no deadlock, every rank stops at the same step, no rank ever
    went past it, and it is at or after every rank's place when the notice came."""
    job = _Job(ranks_per_node, lockstep=lockstep)
    _runs(job, lambda n: data.draw(st.integers(0, n - 1)), notice_after)
    stop = job.store.get("stop")
    assert stop is not None
    assert all(rank.stopped for rank in job.ranks), [vars(r) for r in job.ranks]
    assert {rank.boundary for rank in job.ranks} == {stop}
    assert max(rank.highest for rank in job.ranks) == stop
    assert min(stop - place for place in job.noticed_at.values()) >= 0


def test_a_worker_whose_agent_socket_is_gone_runs_on_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stale ``AIOELASTIC_PREEMPT_SOCKET`` is a warning, not a crash: should_stop is False."""
    monkeypatch.setattr(_preemption, "_LINK", None)
    monkeypatch.setenv(PREEMPT_SOCKET_ENV, str(tmp_path / "gone.sock"))
    with caplog.at_level(logging.WARNING, logger="aioelastic.worker"):
        assert _preemption.should_stop(0, 5) is False
    assert "cannot reach the agent's preemption socket" in caplog.text
    assert PREEMPT_SOCKET_ENV not in os.environ


def test_a_worker_asks_after_the_notice_and_stops_at_the_step_it_is_told() -> None:
    """Over a real socket: no notice, no question; after it, one Ask a boundary until the stop
    step comes; at the stop step the worker says it is stopping, once."""
    ours, agent = socket.socketpair()
    with ours, agent:
        link = _preemption.PreemptionLink(ours)
        link.join(3)
        assert link.should_stop(1) is False
        agent.sendall(b"".join(map(encode_message, [Notice(0, 30.0), Answer(2, None)])))
        assert link.should_stop(2) is False
        agent.sendall(encode_message(StopAt(3)))
        assert [link.should_stop(3), link.should_stop(3)] == [True, True]
        agent.setblocking(False)
        heard = [decode_message(line) for line in agent.recv(4096).splitlines()]
    assert heard == [Join(os.getpid(), 3), Ask(2), Stopping(3)]
    assert link.stop_step == 3
