"""The pure rendezvous state machine, its records and its helpers: plain function calls."""

from __future__ import annotations

from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.rendezvous import InvalidationReason, RendezvousStateError, RendezvousUsageError
from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous import _machine as m

POLICY = m.RoundPolicy(min_nodes=2, max_nodes=3, join_timeout=100.0, last_call_timeout=10.0)


def record(node: int, prev_round: int = 0, prev_rank: int = -1) -> layout.JoinRecord:
    return layout.JoinRecord(node, f"host{node}", 9000 + node, prev_round, prev_rank)


def joined(node: int = 1, arrival: int = 1, now: float = 0.0) -> tuple[m.JoinMachine, m.Command]:
    """A machine that read the state (no round yet), announced, and got ``arrival``."""
    machine = m.JoinMachine(POLICY, node, f"host{node}", 9000 + node)
    assert machine.start(now) == m.ReadState()
    assert machine.send(m.StateRead(latest=0, closed=False), now) == m.Arrive(1, record(node))
    return machine, machine.send(m.Arrived(arrival), now)


def test_on_a_counting_store_the_arrival_reads_the_state_itself() -> None:
    """With read_state_on_arrival, the machine arrives at once at the round after the last it
    completed, and the arrival's own read of ``state/`` decides: a later round sealed means
    arriving again after it; a closed run ends; else it goes on as after a read first."""
    machine = m.JoinMachine(POLICY, 1, "host1", 9001, (3, 0), read_state_on_arrival=True)
    assert machine.start(0.0) == m.Arrive(4, record(1, 3, 0), read_state=True)
    late = machine.send(m.Arrived(1, m.StateRead(latest=6, closed=False)), 0.0)
    assert late == m.Arrive(7, record(1, 3, 0), read_state=True)
    assert machine.send(m.Arrived(2, m.StateRead(6, closed=False)), 1.0) == m.AwaitResult(7, 11.0)

    lagging = m.JoinMachine(POLICY, 1, "host1", 9001, (3, 0), read_state_on_arrival=True)
    lagging.start(0.0)  # state/latest not yet advanced past the round this node completed
    assert lagging.send(m.Arrived(1, m.StateRead(2, closed=False)), 0.0) == m.AwaitResult(4, 100.0)

    closed = m.JoinMachine(POLICY, 1, "host1", 9001, read_state_on_arrival=True)
    assert closed.start(0.0) == m.Arrive(1, record(1), read_state=True)
    assert closed.send(m.Arrived(3, m.StateRead(0, closed=True)), 0.0) == m.Fail(
        m.FailReason.CLOSED, 1
    )


def test_first_arrivals_wait_until_the_join_timeout() -> None:
    """A node below min_nodes waits for the result with only the join deadline."""
    _, command = joined(arrival=1, now=5.0)
    assert command == m.AwaitResult(1, 105.0)


def test_the_min_nodes_arrival_seals_after_the_last_call() -> None:
    """The min_nodes-th arrival waits last_call_timeout, then reads the candidates."""
    machine, command = joined(arrival=2, now=5.0)
    assert command == m.AwaitResult(1, 15.0)
    assert machine.send(m.DeadlineReached(), 15.0) == m.ReadCandidates(1)


def test_the_max_nodes_arrival_seals_at_once() -> None:
    """The max_nodes-th arrival reads the candidates without waiting and publishes them all."""
    machine, command = joined(node=3, arrival=3)
    assert command == m.ReadCandidates(1)
    records = {n: record(n) for n in (1, 2, 3)}
    command = machine.send(m.Candidates(records, frozenset({1, 2, 3})), 0.0)
    assert command == m.Publish(1, layout.RoundResult(1, (1, 2, 3), "host1", 9001).encode())


def test_a_full_round_with_a_dead_joiner_waits_for_the_last_call() -> None:
    """max_nodes arrivals with one of them dead is not full: the last call applies."""
    machine, _ = joined(node=3, arrival=3, now=0.0)
    records = {n: record(n) for n in (1, 2, 3)}
    command = machine.send(m.Candidates(records, frozenset({2, 3})), 1.0)
    assert command == m.AwaitResult(1, 10.0)


def test_too_few_live_candidates_recruit_instead_of_sealing() -> None:
    """At the deadline with fewer than min_nodes alive, the sealer waits for joins."""
    machine, _ = joined(node=2, arrival=2)
    machine.send(m.DeadlineReached(), 10.0)
    command = machine.send(m.Candidates({1: record(1), 2: record(2)}, frozenset({2})), 10.0)
    assert command == m.AwaitJoins(1, 100.0, frozenset({1}))
    assert machine.send(m.JoinsChanged(), 11.0) == m.ReadCandidates(1)
    records = {n: record(n) for n in (2, 4)}
    assert machine.send(m.Candidates(records, frozenset({2, 4})), 11.0) == m.AwaitResult(1, 21.0)


def test_a_result_without_the_node_moves_it_to_the_next_round() -> None:
    """A late node finds the round sealed without it and joins the next one."""
    machine, _ = joined(node=7, arrival=4)
    sealed = layout.RoundResult(1, (1, 2, 3), "host1", 9001).encode()
    assert machine.send(m.ResultSeen(sealed), 1.0) == m.Arrive(2, record(7))


def test_a_result_with_the_node_finishes_with_its_rank() -> None:
    """The node's rank is its position in the sealed members."""
    machine, _ = joined(node=2, arrival=2)
    result = layout.RoundResult(1, (1, 2), "host1", 9001)
    assert machine.send(m.ResultSeen(result.encode()), 1.0) == m.Finish(result, 1)
    assert machine.finished


def test_a_closed_result_fails_as_closed() -> None:
    """The closed marker in the result ends the join as closed."""
    machine, _ = joined()
    assert machine.send(m.ResultSeen(layout.CLOSED_RESULT), 1.0) == m.Fail(m.FailReason.CLOSED, 1)


def test_a_closed_run_fails_before_joining() -> None:
    """A closed run is detected from the state read, before any write."""
    machine = m.JoinMachine(POLICY, 1, "h", 1)
    machine.start(0.0)
    assert machine.send(m.StateRead(latest=4, closed=True), 0.0) == m.Fail(m.FailReason.CLOSED, 0)


def test_the_join_timeout_withdraws_then_reports_the_live_count() -> None:
    """At the join deadline the node withdraws; with no result it times out with the count."""
    machine, _ = joined(arrival=1)
    assert machine.send(m.DeadlineReached(), 100.0) == m.Withdraw(1, 1)
    assert machine.send(m.Withdrawn(None, live=1), 100.0) == m.Fail(m.FailReason.TIMED_OUT, 1, 1)


def test_a_result_found_while_withdrawing_wins_over_the_timeout() -> None:
    """A round sealed with the node just before it withdrew still admits it."""
    machine, _ = joined(node=1, arrival=1)
    machine.send(m.DeadlineReached(), 100.0)
    result = layout.RoundResult(1, (2, 1), "host2", 9002)
    assert machine.send(m.Withdrawn(result.encode(), 2), 100.0) == m.Finish(result, 1)


def test_an_event_the_phase_does_not_expect_is_an_error() -> None:
    """Feeding an event out of order names the event and the phase."""
    machine = m.JoinMachine(POLICY, 1, "h", 1)
    machine.start(0.0)
    with pytest.raises(RendezvousStateError, match="Arrived is not valid while reading"):
        machine.send(m.Arrived(1), 0.0)


def test_a_machine_starts_once() -> None:
    """A JoinMachine is single-use."""
    machine = m.JoinMachine(POLICY, 1, "h", 1)
    machine.start(0.0)
    with pytest.raises(RendezvousStateError, match="joins once"):
        machine.start(0.0)


def test_every_transition_target_is_a_phase_of_the_table() -> None:
    """Terminal phases accept nothing; every non-terminal phase accepts some event."""
    for phase in m.Phase:
        terminal = phase in (m.Phase.DONE, m.Phase.CLOSED, m.Phase.TIMED_OUT)
        assert (phase in m.TRANSITIONS) is not terminal


def test_seal_keeps_previous_ranks_and_fills_the_rest_by_node_id() -> None:
    """Previous members keep ranks below the new size; newcomers take the free ranks."""
    candidates = [record(9, 4, 1), record(5, 4, 0), record(3), record(7, 4, 5)]
    result = m.seal(5, candidates, max_nodes=8)
    assert result.members == (5, 9, 7, 3)


def test_seal_prefers_previous_members_when_over_max() -> None:
    """Over max_nodes, members of the previous round are chosen before newcomers."""
    result = m.seal(2, [record(1), record(8, 1, 0), record(2)], max_nodes=2)
    assert result.members == (8, 1)
    assert (result.master_addr, result.master_port) == ("host8", 9008)


def test_ranks_from_an_older_round_are_not_kept() -> None:
    """Only the immediately previous round's ranks count."""
    assert m.seal(5, [record(1), record(2, 3, 0)], max_nodes=2).members == (1, 2)


@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=12, unique=True),
    st.integers(1, 12),
    st.randoms(),
)
def test_seal_ranks_are_a_permutation(nodes: list[int], max_nodes: int, rnd: Random) -> None:
    """Whatever the previous ranks, the members are unique, at most max_nodes, ranks 0..n-1."""
    ranks = list(range(len(nodes)))
    rnd.shuffle(ranks)
    candidates = [
        record(n, 1, r) if rnd.random() < 0.5 else record(n)
        for n, r in zip(nodes, ranks, strict=True)
    ]
    result = m.seal(2, candidates, max_nodes)
    assert len(result.members) == min(max_nodes, len(nodes))
    assert len(set(result.members)) == len(result.members)
    for c in candidates:
        if c.node in result.members and c.prev_round == 1 and c.prev_rank < result.world_size:
            assert result.rank_of(c.node) == c.prev_rank


@given(st.text(min_size=1), st.integers(0, 65535), st.integers(0, 99), st.integers(-1, 99))
def test_join_records_round_trip(addr: str, port: int, prev_round: int, prev_rank: int) -> None:
    """A join record decodes to what was encoded."""
    original = layout.JoinRecord(3, addr, port, prev_round, prev_rank)
    assert layout.JoinRecord.decode(3, original.encode()) == original


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=20), st.text(), st.integers(0, 65535))
def test_results_round_trip(members: list[int], addr: str, port: int) -> None:
    """A result decodes to what was encoded."""
    original = layout.RoundResult(4, tuple(members), addr, port)
    assert layout.RoundResult.decode(4, original.encode()) == original


@pytest.mark.parametrize("data", [b"", b"{", b"[1, 2]", b'["a", "b", "c"]'])
def test_malformed_records_and_results_name_the_node_or_round(data: bytes) -> None:
    """Garbage in the store is a RendezvousStateError naming where it was found."""
    with pytest.raises(RendezvousStateError, match="join record of node 3 is malformed"):
        layout.JoinRecord.decode(3, data)
    with pytest.raises(RendezvousStateError, match="result of round 4 is malformed"):
        layout.RoundResult.decode(4, data)


def test_assess_inbox_ranks_closed_over_lost_over_waiting() -> None:
    """Closed beats a lost participant, which beats waiting nodes; strangers' losses are ignored."""
    members = (1, 2, 3)
    waiting = {"round/5/join/9": b"x", "round/5/count": b"1"}
    lost = {**waiting, "round/5/lost/2": b"lost", "round/5/lost/8": b"lost"}
    closed = {**lost, "round/5/result": layout.CLOSED_RESULT}
    assert m.assess_inbox(members, 4, {"round/5/count": b"1"}) is None
    assert m.assess_inbox(members, 4, {"round/5/lost/8": b"x"}) is None
    verdicts = [m.assess_inbox(members, 4, items) for items in (waiting, lost, closed)]
    reasons = [v.reason if v else None for v in verdicts]
    assert reasons == [
        InvalidationReason.NODES_WAITING,
        InvalidationReason.PARTICIPANT_LOST,
        InvalidationReason.CLOSED,
    ]
    assert verdicts[1] is not None
    assert "node(s) 2 of round 4" in verdicts[1].detail


def test_ring_successor_wraps_and_is_none_alone() -> None:
    """Each member watches the next in rank order; the last watches rank 0."""
    assert [m.ring_successor((4, 7, 1), n) for n in (4, 7, 1)] == [7, 1, 4]
    assert m.ring_successor((4,), 4) is None


def test_alive_keys_parse_to_node_ids() -> None:
    """Liveness keys name node ids; other keys under node/ are ignored."""
    keys = [layout.alive_key(3), layout.alive_key(12), "node/5/other"]
    assert layout.parse_alive(keys) == frozenset({3, 12})


def test_a_recruiter_waits_for_joins_after_the_revision_it_read() -> None:
    """The wait for more joins starts at the store revision of the candidates' read."""
    machine, _ = joined(node=2, arrival=2)
    machine.send(m.DeadlineReached(), 10.0)
    records = {1: record(1), 2: record(2)}
    command = machine.send(m.Candidates(records, frozenset({2}), revision=41), 10.0)
    assert command == m.AwaitJoins(1, 100.0, frozenset({1}), after=41)


@pytest.mark.parametrize(
    ("round_", "replies", "expected"),
    [
        (1, [b"1"], [b""]),  # round 1 expects no key and stores it at once
        (3, [b"3"], [b"2"]),  # the usual case: one compare-and-set from the round before
        (3, [b"2", b"3"], [b"2", b""]),  # no key yet: compared with nothing, then stored
        (3, [b"1", b"3"], [b"2", b"1"]),  # a late latest: expect what is there
        (3, [b"5"], [b"2"]),  # already beyond: never moved back
    ],
)
def test_advancing_latest_compares_until_it_is_there_or_beyond(
    round_: int, replies: list[bytes], expected: list[bytes]
) -> None:
    """Each compare-and-set expects what the last one found; the loop ends at or past round."""
    step: m.AdvanceLatest | None = m.AdvanceLatest.first(round_)
    seen = []
    for reply in replies:
        assert step is not None
        assert (step.key, step.desired) == (layout.LATEST_KEY, str(round_).encode())
        seen.append(step.expected)
        step = step.then(reply)
    assert (seen, step) == (expected, None)


def test_closing_probes_rounds_until_the_marker_is_stored() -> None:
    """The closed marker goes into the first round without a result, sealed ones are skipped."""
    step = m.CloseRound(4)
    assert (step.key, step.expected, step.desired) == (
        layout.result_key(4),
        b"",
        layout.CLOSED_RESULT,
    )
    assert step.then(b'["h", 1, [1]]') == m.CloseRound(5)
    assert m.CloseRound(5).then(layout.CLOSED_RESULT) is None


def test_misuse_is_a_usage_error_and_still_a_state_error() -> None:
    """Misuse raises RendezvousUsageError, which callers catching RendezvousStateError see."""
    machine = m.JoinMachine(POLICY, 1, "h", 1)
    with pytest.raises(RendezvousUsageError, match="not valid while reading"):
        machine.send(m.StateRead(0, closed=False), 0.0)  # before start()
    assert issubclass(RendezvousUsageError, RendezvousStateError)
