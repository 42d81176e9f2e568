"""The generation protocol (pure core), driven through the test kit's WorldSimulation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aioelastic.agent._generations import (
    LEAVE_CAUSES,
    Begin,
    EndWorld,
    Entered,
    Evict,
    EvictCause,
    Exited,
    FallBack,
    Generation,
    GenerationLogError,
    GenerationMachine,
    GenerationProtocolError,
    LeaveDue,
    LogEntry,
    NodeJoined,
    NodeLost,
    NodeOut,
    NodeSpec,
    OwnError,
    Phase,
    Ready,
    Spawn,
    Tick,
    TimedOut,
    Troubled,
    VerdictDue,
    WorkerKey,
    decode_entry,
    encode_entry,
    suspects,
)
from aioelastic.testing import WorldSimulation


def formed(nodes: dict[int, NodeSpec], **options: float) -> WorldSimulation:
    """A simulation whose generation 1 formed."""
    sim = WorldSimulation(nodes, **options)
    sim.enter_all()
    assert sim.machine.phase is Phase.RUNNING
    return sim


def test_generation_one_waits_for_every_worker_and_keeps_the_environment_ranks() -> None:
    """Generation 1 is assigned only when every slot asked, with ranks in node and slot order."""
    sim = WorldSimulation({0: NodeSpec(2), 1: NodeSpec(2)})
    first = sim.waiting()
    for key in first[:-1]:
        sim.ready(key)
    assert sim.machine.generation is None
    sim.ready(first[-1])
    generation = sim.machine.generation
    assert generation is not None
    assert [(k.node, s) for k, s in zip(generation.members, generation.slots, strict=True)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert generation.fresh == frozenset()


def test_failure_replaces_only_that_worker_and_survivors_keep_their_ranks() -> None:
    """Rank 2 fails: a new process takes slot 2, ranks 0, 1 and 3 stay with their workers."""
    sim = formed({0: NodeSpec(4)})
    before = sim.machine.generation
    assert before is not None
    failed = sim.member(2)
    sim.fail(failed)
    after = sim.machine.generation
    assert after is not None
    assert after.number == 2
    assert [after.members[r] for r in (0, 1, 3)] == [before.members[r] for r in (0, 1, 3)]
    assert after.members[2] not in before.members
    assert after.fresh_ranks == (2,)
    assert after.source_rank == 0
    spawned = [c for c in sim.commands if isinstance(c, Spawn)]
    assert spawned[-1] == Spawn(after.members[2], 2)
    sim.enter_all()
    assert sim.machine.phase is Phase.RUNNING
    assert sim.formed[-1].since_failure == 0.0


def test_a_spare_takes_the_place_and_a_new_spare_is_started_once_it_formed() -> None:
    """With a ready spare, the failed slot is the spare's at once; another spare starts once
    the new generation formed (not while its members start)."""
    sim = formed({0: NodeSpec(2, spares=1)})
    spare = sim.machine.spares(0)[0]
    spawned = len([c for c in sim.commands if isinstance(c, Spawn)])
    sim.fail(sim.member(1))
    generation = sim.machine.generation
    assert generation is not None
    assert generation.members[1] == spare
    assert sim.running[spare].place is not None  # assigned without waiting for anything
    assert len([c for c in sim.commands if isinstance(c, Spawn)]) == spawned
    sim.enter_all()
    assert sim.formed[-1].replacements[0].spare
    new = [c for c in sim.commands if isinstance(c, Spawn)][spawned:]
    assert [c.slot for c in new] == [None]
    assert sim.machine.spares(0) == (new[0].worker,)


def test_a_second_failure_while_forming_gets_a_new_process_not_a_spare_never_started() -> None:
    """The spare took the first failed slot; the next failure before the world formed goes to
    a new process at once (no spare exists to wait for), and the world forms."""
    sim = formed({0: NodeSpec(2, spares=1)})
    spare = sim.machine.spares(0)[0]
    sim.fail(sim.member(0))
    sim.fail(sim.member(1))
    generation = sim.machine.generation
    assert generation is not None
    assert generation.members[0] == spare
    replaced = next(c for c in reversed(sim.commands) if isinstance(c, Spawn))
    assert (replaced.worker, replaced.slot) == (generation.members[1], 1)
    sim.enter_all()
    assert sim.machine.phase is Phase.RUNNING
    assert len(sim.machine.spares(0)) == 1


def test_the_holders_of_a_nodes_slots_are_its_members_never_an_idle_spare() -> None:
    """Before a generation, each slot's started worker holds it; after a replacement, the spare
    that took the slot does, and the new idle spare holds nothing."""
    sim = WorldSimulation({0: NodeSpec(2, spares=1), 1: NodeSpec(1)})
    assert sim.machine.holders(0) == {0: WorkerKey(0, 0), 1: WorkerKey(0, 1)}
    sim.enter_all()
    spare = sim.machine.spares(0)[0]
    sim.fail(sim.member(0))
    sim.enter_all()
    new_spare = sim.machine.spares(0)[0]
    assert sim.machine.holders(0) == {0: spare, 1: WorkerKey(0, 1)}
    assert new_spare not in sim.machine.holders(0).values()
    assert sim.machine.holders(1) == {0: WorkerKey(1, 0)}


def test_two_failures_at_once_make_consecutive_generations_with_both_replaced() -> None:
    """Two ranks die before anyone re-forms: both slots get new workers; numbers only grow."""
    sim = formed({0: NodeSpec(4)})
    one, two = sim.member(1), sim.member(3)
    sim.fail(one)
    sim.fail(two)
    generation = sim.machine.generation
    assert generation is not None
    assert generation.number == 3
    assert {one, two}.isdisjoint(generation.members)
    sim.enter_all()
    assert sim.machine.phase is Phase.RUNNING
    assert [f.generation.number for f in sim.formed] == [1, 3]


def test_failure_while_forming_keeps_the_first_failure_time() -> None:
    """A member dying while a generation forms makes the next; time counts from the first."""
    sim = formed({0: NodeSpec(3)})
    sim.fail(sim.member(0))
    sim.advance(2.0)
    sim.fail(sim.member(1))
    sim.advance(1.0)
    sim.enter_all()
    assert sim.formed[-1].since_failure == 3.0
    assert sim.formed[-1].generation.fresh_ranks == (0, 1)
    assert sim.formed[-1].generation.source_rank == 2


def test_a_spare_dying_is_replaced_and_costs_no_generation() -> None:
    """A waiting spare that dies is started again; the running world is not disturbed."""
    sim = formed({0: NodeSpec(2, spares=1)})
    spare = sim.machine.spares(0)[0]
    sim.fail(spare)
    assert sim.machine.generation is not None
    assert sim.machine.generation.number == 1
    assert sim.machine.phase is Phase.RUNNING
    assert isinstance(sim.commands[-1], Spawn)
    assert sim.commands[-1].slot is None


def test_an_agent_dying_leaves_a_smaller_world_with_dense_ranks() -> None:
    """Node 1 of three is lost: the others form a world of their 4 workers, ranks 0..3."""
    sim = formed({0: NodeSpec(2), 1: NodeSpec(2), 2: NodeSpec(2)})
    sim.lose_node(1)
    sim.enter_all()
    generation = sim.machine.generation
    assert generation is not None
    assert generation.world_size == 4
    assert {k.node for k in generation.members} == {0, 2}
    assert generation.members[:2] == sim.generations[0].members[:2]


def test_a_node_joining_during_recovery_is_admitted_after_it_forms() -> None:
    """A node joins while a generation forms: that one forms without it, the next includes it."""
    sim = formed({0: NodeSpec(2)})
    sim.fail(sim.member(0))
    sim.join_node(1, NodeSpec(2))
    assert sim.machine.phase is Phase.FORMING
    sim.enter_all()
    generation = sim.machine.generation
    assert generation is not None
    assert generation.world_size == 4
    assert generation.reason == "node 1 joined"
    assert sim.machine.phase is Phase.RUNNING


def test_a_member_gone_asks_the_survivors_to_abort_and_a_join_does_not() -> None:
    """A failure or a lost node ends the world with an abort (a collective with the gone member
    never completes); a node joining ends it without one (every collective completes)."""
    sim = formed({0: NodeSpec(2), 1: NodeSpec(1)})
    sim.fail(sim.member(1))
    sim.enter_all()
    sim.lose_node(1)
    sim.enter_all()
    sim.join_node(2, NodeSpec(1))
    sim.enter_all()
    ends = [(c.reason, c.abort) for c in sim.commands if isinstance(c, EndWorld)]
    assert ends == [
        ("rank 1 (worker 0.1) failed (status 1)", True),
        ("node 1 was lost", True),
        ("node 2 joined", False),
    ]


def test_a_survivor_stuck_in_its_ended_world_is_taken_out_and_its_slot_refilled() -> None:
    """Rank 3 fails; rank 0 never enters generation 2: reported stuck, it is evicted (killed),
    a spare takes its slot in generation 3, and the other survivors keep theirs."""
    sim = formed({0: NodeSpec(4, spares=2)})
    first = sim.machine.generation
    assert first is not None
    stuck = sim.member(0)
    sim.fail(sim.member(3))
    for key in sim.assigned():
        if key != stuck:
            sim.enter(key)
    sim.stuck(stuck, EvictCause.ABORT_UNAVAILABLE, "backend 'mpi' has no abort here")
    evicted = [c for c in sim.commands if isinstance(c, Evict)]
    assert evicted == [
        Evict(
            stuck,
            1,
            EvictCause.ABORT_UNAVAILABLE,
            "rank 0 (worker 0.0) was taken out: abort unavailable from generation 1: "
            "backend 'mpi' has no abort here",
        )
    ]
    assert sim.exited[stuck] == -9
    sim.enter_all()
    third = sim.machine.generation
    assert third is not None
    assert third.number == 3
    assert stuck not in third.members
    assert third.members[1:3] == first.members[1:3]
    assert sim.machine.phase is Phase.RUNNING
    assert sim.machine.failures == 2


def test_a_survivor_that_left_in_time_is_not_taken_out() -> None:
    """Reported after it entered the next world (or after that world formed), it stays."""
    sim = formed({0: NodeSpec(3)})
    survivor = sim.member(0)
    sim.fail(sim.member(2))
    sim.enter(survivor)
    sim.stuck(survivor)
    sim.enter_all()
    sim.stuck(survivor)
    assert not [c for c in sim.commands if isinstance(c, Evict)]
    assert survivor in sim.running


def test_a_report_of_an_older_world_does_not_take_out_a_survivor_of_a_newer_one() -> None:
    """Stuck in generation 1 is old news once it entered 2: generation 3 forming does not
    evict it for that."""
    sim = formed({0: NodeSpec(3)})
    survivor = sim.member(0)
    sim.fail(sim.member(2))
    sim.enter(survivor)
    sim.fail(sim.member(1))
    assert sim.machine.phase is Phase.FORMING
    commands = sim.machine.send(LeaveDue(survivor, 1, EvictCause.DID_NOT_LEAVE), 0.0)
    assert commands == []


def test_a_node_that_says_it_leaves_is_gone_at_once_with_that_reason() -> None:
    """A node's agent logs its own leaving: the next generation is made without it, saying so
    (on every replica alike)."""
    sim = formed({0: NodeSpec(1), 1: NodeSpec(1), 2: NodeSpec(1)}, replicas=3)
    sim.lose_node(2, left=True)
    generation = sim.machine.generation
    assert generation is not None
    assert (generation.number, generation.world_size, generation.reason) == (2, 2, "node 2 left")
    ends = [c for c in sim.commands if isinstance(c, EndWorld)]
    assert ends[-1].abort
    assert not any(isinstance(c, NodeOut) for c in sim.commands)  # it is stopping already


def test_a_node_taken_for_lost_while_it_runs_stops_its_workers_and_the_others_go_on() -> None:
    """Node 1 missed a round, its agent alive: every replica tells that agent to stop its
    workers (their places are given away), and the others make their world without it."""
    sim = formed({0: NodeSpec(1), 1: NodeSpec(2, spares=1), 2: NodeSpec(1)}, replicas=3)
    sim.take_for_lost(1)
    assert NodeOut(1, "node 1 was lost") in sim.commands
    assert [k for k in sim.running if k.node == 1] == []
    sim.enter_all()
    generation = sim.machine.generation
    assert generation is not None
    assert (generation.number, generation.world_size) == (2, 2)
    assert {k.node for k in generation.members} == {0, 2}


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_silent_member_while_most_collectives_failed_is_evicted_as_hung(replicas: int) -> None:
    """Ranks 0 and 1 of 3 nodes ask (their collectives timed out), rank 2 says nothing: at the
    first look it is evicted, on every replica alike, and its node's spare takes the slot."""
    sim = formed({n: NodeSpec(1, spares=1) for n in range(3)}, replicas=replicas)
    hung = sim.member(2)
    for rank in (0, 1):
        sim.trouble(sim.member(rank))
    sim.verdict_due(sim.member(0), final=False)
    assert [c for c in sim.commands if isinstance(c, Evict)] == [
        Evict(
            hung,
            1,
            EvictCause.HUNG,
            "2 of 3 ranks' collectives failed in generation 1 while it answered nothing: "
            "taken for hung",
        )
    ]
    generation = sim.machine.generation
    assert generation is not None
    assert generation.reason == "rank(s) 2 taken for hung"
    assert generation.members[2].node == hung.node != generation.members[2].serial
    assert not [c for c in sim.commands if isinstance(c, OwnError)]
    sim.enter_all()
    assert sim.machine.phase is Phase.RUNNING


def test_a_minority_that_asks_is_told_at_the_final_verdict_that_the_error_is_its_own() -> None:
    """Rank 1 of 3 asks: the early look evicts nobody; the final verdict says "own error"."""
    sim = formed({0: NodeSpec(3)})
    asker = sim.member(1)
    sim.trouble(asker)
    sim.verdict_due(asker, final=False)
    assert not [c for c in sim.commands if isinstance(c, OwnError | Evict)]
    sim.verdict_due(asker)
    assert [c for c in sim.commands if isinstance(c, OwnError)] == [OwnError(asker, 1)]
    sim.verdict_due(asker)
    assert len([c for c in sim.commands if isinstance(c, OwnError)]) == 1  # once


def test_a_member_told_its_error_is_its_own_is_never_taken_for_hung() -> None:
    """Rank 1 was told its error is its own (it is failing); ranks 0 and 2 then ask: rank 1 is
    not evicted for saying nothing more, and the machine says a condemned peer still runs."""
    sim = formed({0: NodeSpec(3)})
    sim.trouble(sim.member(1))
    sim.verdict_due(sim.member(1))
    assert sim.machine.condemned_alive(sim.member(0))
    assert not sim.machine.condemned_alive(sim.member(1))
    for rank in (0, 2):
        sim.trouble(sim.member(rank))
    sim.verdict_due(sim.member(0), final=False)
    assert not [c for c in sim.commands if isinstance(c, Evict)]
    sim.fail(sim.member(1))  # its exit ends the world: the others' questions are answered
    assert sim.machine.generation is not None
    assert sim.machine.generation.number == 2
    assert not sim.machine.condemned_alive(sim.member(0))


def test_a_question_about_an_ended_world_gets_no_verdict() -> None:
    """A member that asked about generation 1 after it ended is answered by the end alone."""
    sim = formed({0: NodeSpec(3)})
    asker = sim.member(0)
    sim.fail(sim.member(2))
    assert sim.machine.send(Troubled(asker, 1), 0.0) == []
    assert sim.machine.send(VerdictDue(asker, 1, True), 0.0) == []


def test_a_generation_that_does_not_form_in_time_falls_back_naming_who() -> None:
    """A replacement that never asks for a world: after the timeout, a full restart."""
    sim = formed({0: NodeSpec(2)}, recovery_timeout=10.0)
    sim.fail(sim.member(1))
    sim.enter(sim.member(0))
    sim.advance(9.0)
    assert sim.fallback is None
    sim.advance(1.0)
    assert sim.fallback is not None
    assert "generation 2 did not form within 10 s: rank 1 (worker 0.2) never asked" in sim.fallback


def test_a_worker_not_using_the_api_keeps_todays_behaviour() -> None:
    """Workers that never ask for a world: a failure falls back, all exiting 0 finishes."""
    sim = WorldSimulation({0: NodeSpec(2)})
    keys = sim.waiting()
    sim.fail(keys[0])
    assert sim.fallback is not None
    assert "before every worker asked for a world" in sim.fallback
    quiet = WorldSimulation({0: NodeSpec(2)})
    for key in quiet.waiting():
        quiet.fail(key, 0)
    assert quiet.finished


def test_every_member_succeeding_finishes_and_stops_the_spares() -> None:
    """The job ends when the running generation's members all exit 0."""
    sim = formed({0: NodeSpec(2, spares=1)})
    for rank in range(2):
        sim.fail(sim.member(rank), 0)
    assert sim.finished


def test_unknown_worker_is_a_protocol_error_naming_it() -> None:
    """An event about a worker the machine never started is refused, with the phase."""
    machine = GenerationMachine({0: NodeSpec(1)}, recovery_timeout=5.0)
    machine.start(0.0)
    with pytest.raises(GenerationProtocolError, match=r"Ready .* in phase WAITING: worker 0\.9"):
        machine.send(Ready(WorkerKey(0, 9)), 0.0)


class RandomWorld(RuleBasedStateMachine):
    """Random failures, spares dying, agents dying, nodes joining and time passing."""

    sim: WorldSimulation
    replicas = 1

    @initialize(
        sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3),
        spares=st.integers(0, 1),
    )
    def start(self, sizes: list[int], spares: int) -> None:
        self.sim = WorldSimulation(
            {n: NodeSpec(size, spares) for n, size in enumerate(sizes)},
            recovery_timeout=10.0,
            replicas=self.replicas,
        )
        self.next_node = len(sizes)

    def live(self) -> bool:
        return self.sim.machine.phase not in (Phase.FINISHED, Phase.FELL_BACK)

    @precondition(lambda self: self.live() and self.sim.waiting())
    @rule(data=st.data())
    def ask(self, data: st.DataObject) -> None:
        self.sim.ready(data.draw(st.sampled_from(self.sim.waiting())))

    @precondition(lambda self: self.live() and self.sim.assigned())
    @rule(data=st.data())
    def enter(self, data: st.DataObject) -> None:
        self.sim.enter(data.draw(st.sampled_from(self.sim.assigned())))

    @precondition(lambda self: self.live() and self.sim.running)
    @rule(data=st.data(), returncode=st.sampled_from([1, -9, 0]))
    def die(self, data: st.DataObject, returncode: int) -> None:
        self.sim.fail(data.draw(st.sampled_from(sorted(self.sim.running))), returncode)

    @precondition(lambda self: self.live() and len(self.sim.running) >= 2)
    @rule(data=st.data())
    def two_die_at_once(self, data: st.DataObject) -> None:
        pair = data.draw(
            st.lists(st.sampled_from(sorted(self.sim.running)), min_size=2, max_size=2, unique=True)
        )
        for key in pair:
            self.sim.fail(key)

    @precondition(lambda self: self.live() and self.sim.specs)
    @rule(data=st.data())
    def agent_dies(self, data: st.DataObject) -> None:
        self.sim.lose_node(data.draw(st.sampled_from(sorted(self.sim.specs))))

    @precondition(lambda self: self.live() and self.sim.specs)
    @rule(data=st.data())
    def node_taken_for_lost(self, data: st.DataObject) -> None:
        self.sim.take_for_lost(data.draw(st.sampled_from(sorted(self.sim.specs))))

    @precondition(lambda self: self.live() and self.next_node < 5)
    @rule(size=st.integers(1, 2), spares=st.integers(0, 1))
    def node_joins(self, size: int, spares: int) -> None:
        self.sim.join_node(self.next_node, NodeSpec(size, spares))
        self.next_node += 1

    @precondition(lambda self: self.live() and any(w.ended for w in self.sim.running.values()))
    @rule(data=st.data(), cause=st.sampled_from(LEAVE_CAUSES))
    def stuck(self, data: st.DataObject, cause: EvictCause) -> None:
        told = sorted(k for k, w in self.sim.running.items() if w.ended)
        self.sim.stuck(data.draw(st.sampled_from(told)), cause)

    @precondition(lambda self: self.live() and self.in_a_world())
    @rule(data=st.data())
    def trouble(self, data: st.DataObject) -> None:
        self.sim.trouble(data.draw(st.sampled_from(self.in_a_world())))

    @precondition(lambda self: self.live() and self.askers())
    @rule(data=st.data(), final=st.booleans())
    def verdict(self, data: st.DataObject, final: bool) -> None:
        self.sim.verdict_due(data.draw(st.sampled_from(self.askers())), final=final)

    def in_a_world(self) -> list[WorkerKey]:
        return sorted(k for k, w in self.sim.running.items() if w.place is not None)

    def askers(self) -> list[WorkerKey]:
        return sorted(k for k, w in self.sim.running.items() if w.troubled)

    @rule(seconds=st.sampled_from([0.5, 4.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.sim.advance(seconds)

    @invariant()
    def promises_hold(self) -> None:
        self.sim.check()

    def teardown(self) -> None:
        """Once the processes stop misbehaving, the world always settles: formed, or ended."""
        if not hasattr(self, "sim") or not self.live():
            return
        self.sim.enter_all()
        phase = self.sim.machine.phase
        assert phase in (Phase.RUNNING, Phase.FINISHED, Phase.FELL_BACK), phase
        if phase is Phase.RUNNING:
            generation = self.sim.machine.generation
            assert generation is not None
            in_world = {k.node for k in generation.members}
            assert in_world == set(self.sim.specs)
            assert (
                sum(self.sim.specs[n].local_world_size for n in in_world) == generation.world_size
            )
        if phase is Phase.FELL_BACK:
            assert any(isinstance(c, FallBack) for c in self.sim.commands)


RandomWorld.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=25,
    suppress_health_check=[HealthCheck.too_slow],
)
test_random_world = RandomWorld.TestCase


class RandomReplicatedWorld(RandomWorld):
    """The same random worlds over three agents' replicas fed through the generation log (and
    a late replica per joining node that replays it): they never disagree."""

    replicas = 3


RandomReplicatedWorld.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=25,
    suppress_health_check=[HealthCheck.too_slow],
)
test_random_replicated_world = RandomReplicatedWorld.TestCase


def test_workers_mixing_the_api_and_plain_exits_fall_back_saying_why() -> None:
    """One worker asks for a world while another exits 0 without: a restart, with the reason."""
    sim = WorldSimulation({0: NodeSpec(2)})
    asking, plain = sim.waiting()
    sim.ready(asking)
    sim.fail(plain, 0)
    assert sim.fallback is not None
    assert "every worker of the job uses aioelastic.worker or none does" in sim.fallback


def test_a_failure_storm_falls_back_instead_of_replacing_forever() -> None:
    """A failure every fresh worker meets: after max_failures replacements, a restart."""
    sim = WorldSimulation({0: NodeSpec(2)})
    sim.machine.max_failures = 3
    sim.enter_all()
    for _ in range(3):
        sim.fail(sim.member(1))
        sim.enter_all()
    assert sim.fallback is None
    sim.fail(sim.member(1))
    assert sim.fallback is not None
    assert "4 failures in place exceed the 3 one attempt may replace" in sim.fallback


@pytest.mark.parametrize(
    ("troubled", "evicted"),
    [
        ({0, 1, 3}, (2,)),  # most collectives failed; rank 2 said nothing: hung
        ({1}, ()),  # one rank in trouble: its own bug
        ({0, 1}, ()),  # a tie is not a majority
        ({0, 1, 2, 3}, ()),  # everyone in trouble: nobody to blame
    ],
)
def test_suspects_are_the_silent_minority(troubled: set[int], evicted: tuple[int, ...]) -> None:
    """Only when most members saw their collectives fail are the silent ones evicted."""
    members = [WorkerKey(0, serial) for serial in range(4)]
    found = suspects(members, {members[i] for i in troubled})
    assert found == tuple(members[i] for i in evicted)


def test_a_spare_still_starting_takes_the_place_before_a_new_process() -> None:
    """A spare that has not asked yet is further along than a process started now."""
    sim = WorldSimulation({0: NodeSpec(2, spares=1)})
    spare = next(k for k, w in sim.running.items() if w.spawned_for is None)
    for key in sim.waiting():
        if key != spare:
            sim.ready(key)
    for key in sim.assigned():
        sim.enter(key)
    sim.fail(sim.member(1))
    generation = sim.machine.generation
    assert generation is not None
    assert generation.members[1] == spare
    assert sim.running[spare].place is None  # assigned once it asks
    sim.ready(spare)
    assert sim.running[spare].place is not None
    sim.enter_all()
    assert sim.formed[-1].replacements[0].spare


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), unique=True, min_size=1),
    st.data(),
)
def test_a_generations_lookups_agree_with_its_member_list(
    keys: list[tuple[int, int]], data: st.DataObject
) -> None:
    """rank_of, place_of, fresh_ranks and source_rank say what scanning the members says."""
    members = tuple(WorkerKey(node, serial) for node, serial in keys)
    fresh = frozenset(data.draw(st.sets(st.sampled_from(members))))
    generation = Generation(7, members, tuple(range(len(members))), fresh, "test")
    assert generation.fresh_ranks == tuple(r for r, k in enumerate(members) if k in fresh)
    assert generation.source_rank == next((r for r, k in enumerate(members) if k not in fresh), 0)
    for rank, key in enumerate(members):
        assert key in generation
        assert generation.rank_of(key) == rank
        place = generation.place_of(key)
        assert (place.rank, place.local_rank, place.is_fresh) == (rank, rank, key in fresh)
    assert WorkerKey(9, 0) not in generation


SPECS = st.builds(NodeSpec, st.integers(1, 8), st.integers(0, 2))
EVENTS = st.one_of(
    st.builds(Ready, st.builds(WorkerKey, st.integers(0, 9), st.integers(0, 99))),
    st.builds(Entered, st.builds(WorkerKey, st.integers(0, 9), st.integers(0, 99)), st.integers(1)),
    st.builds(Exited, st.builds(WorkerKey, st.integers(0, 9), st.integers(0, 99)), st.integers()),
    st.builds(NodeLost, st.integers(0, 2**40), st.booleans()),
    st.builds(
        NodeJoined, st.integers(0), st.builds(NodeSpec, st.integers(1, 8), st.integers(0, 2))
    ),
    st.builds(TimedOut, st.integers(1)),
    st.builds(
        Troubled, st.builds(WorkerKey, st.integers(0, 9), st.integers(0, 99)), st.integers(1)
    ),
    st.builds(
        VerdictDue,
        st.builds(WorkerKey, st.integers(0, 9), st.integers(0, 99)),
        st.integers(1),
        st.booleans(),
    ),
    st.builds(
        LeaveDue,
        st.builds(WorkerKey, st.integers(0, 9), st.integers(0, 99)),
        st.integers(1),
        st.sampled_from(EvictCause),
        st.text(max_size=30),
    ),
    st.builds(
        Begin,
        st.dictionaries(st.integers(0), SPECS),
        st.integers(1),
    ),
)


@given(EVENTS, st.text(max_size=20), st.integers(0), st.none() | st.integers(1, 2**22))
def test_a_log_entry_survives_its_codec(event: Any, by: str, serial: int, pid: int | None) -> None:
    """Every event the log carries decodes to itself, with who appended it."""
    entry = LogEntry(event, by, serial, pid)
    assert decode_entry(encode_entry(entry)) == entry


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'{"e": {"ready": [1]}, "by": "", "n": 0, "pid": null}', b'{"e": {"nap": 1}}'],
)
def test_a_bad_log_entry_is_an_error_that_shows_it(raw: bytes) -> None:
    """Bytes that encode no entry raise GenerationLogError naming them."""
    with pytest.raises(GenerationLogError, match="bad generation log entry"):
        decode_entry(raw)


def test_a_tick_never_enters_the_log() -> None:
    """Only TimedOut carries a deadline between replicas (a Tick depends on one clock)."""
    with pytest.raises(ValueError, match="TimedOut"):
        encode_entry(LogEntry(Tick()))


def test_a_timed_out_generation_falls_back_on_every_replica_whatever_their_clocks() -> None:
    """TimedOut(n) falls back while n forms; a TimedOut of a formed generation changes nothing."""
    sim = WorldSimulation({0: NodeSpec(1), 1: NodeSpec(1)}, replicas=3, recovery_timeout=5.0)
    sim.enter_all()
    sim.advance(6.0)  # generation 1 formed: its deadline is gone
    assert sim.machine.phase is Phase.RUNNING
    sim.fail(sim.member(1))
    sim.ready_all()
    sim.advance(6.0)
    assert sim.fallback is not None
    assert "generation 2 did not form within 5 s" in sim.fallback
    assert all(r.phase is Phase.FELL_BACK for r in sim.replicas)


def test_a_node_lost_and_rejoining_keeps_the_survivors_on_every_replica() -> None:
    """Node 1 lost, then back (a late replica replays the log): survivors keep their workers."""
    sim = WorldSimulation({0: NodeSpec(2), 1: NodeSpec(1), 2: NodeSpec(1)}, replicas=3)
    sim.enter_all()
    first = sim.machine.generation
    assert first is not None
    sim.lose_node(1)
    sim.enter_all()
    smaller = sim.machine.generation
    assert smaller is not None
    assert smaller.world_size == 3
    assert set(smaller.members) < set(first.members)
    sim.join_node(1, NodeSpec(1))
    sim.enter_all()
    larger = sim.machine.generation
    assert larger is not None
    assert larger.world_size == 4
    assert set(smaller.members) < set(larger.members)
    assert [larger.members[r] for r in range(3)] == list(smaller.members)


def test_a_node_joining_before_generation_one_is_one_of_its_own() -> None:
    """A node joins while the first workers still start: generation 1 waits for it too."""
    sim = WorldSimulation({0: NodeSpec(1), 1: NodeSpec(1)}, replicas=2)
    sim.ready(sim.waiting()[0])
    sim.join_node(5, NodeSpec(2))
    sim.enter_all()
    generation = sim.machine.generation
    assert generation is not None
    assert generation.number == 1
    assert [k.node for k in generation.members] == [0, 1, 5, 5]
    assert sim.fallback is None
