"""The in-place recovery core (the agents' replicas of the generation machine), explored at
random: failures while a generation forms, two at once, spares dying, nodes lost and joining
again, time passing with every agent's deadlines live; the protocol's promises checked after
every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aioelastic.agent._generations import (
    TERMINAL_PHASES,
    Begin,
    EndWorld,
    Entered,
    Evict,
    EvictCause,
    Exited,
    FallBack,
    Generation,
    GenerationAssigned,
    GenerationProtocolError,
    LogEntry,
    NodeJoined,
    NodeLost,
    NodeSpec,
    Phase,
    Ready,
    Spawn,
    TimedOut,
    Troubled,
    WorkerKey,
)
from aioelastic.agent._replica import Replica
from aioelastic.testing import WorldSimulation

PLAIN_FAILURE = "failed (status"
"""How a fall back caused by one member's failure begins its reason (after the rank)."""
ALLOWED_AFTER_A_FAILURE = ("failures in place exceed", "after other ranks had finished")
"""Why a member's failure may end in a restart anyway: a storm, or a job already ending."""


class RandomRecoveries(RuleBasedStateMachine):
    """Random event orders against the agents' replicas, with the promises as invariants."""

    sim: WorldSimulation
    replicas = 1

    @initialize(
        sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3),
        spares=st.integers(0, 2),
        missed=st.booleans(),
    )
    def start(self, sizes: list[int], spares: int, missed: bool) -> None:
        """``missed``: the last of several nodes missed the epoch's beginning (the round ended
        under it in its slot exchange, after the others had read its slot)."""
        self.sim = WorldSimulation(
            {n: NodeSpec(size, spares) for n, size in enumerate(sizes)},
            recovery_timeout=10.0,
            replicas=self.replicas,
            leave_timeout=5.0,
            missed={len(sizes) - 1} if missed and len(sizes) > 1 else (),
        )
        self.began_with = {n: NodeSpec(size, spares) for n, size in enumerate(sizes)}
        self.lost: list[tuple[int, NodeSpec]] = []
        self.next_node = len(sizes)
        self.checked = 0

    def live(self) -> bool:
        return self.sim.machine.phase not in TERMINAL_PHASES

    def forming(self) -> bool:
        return self.sim.machine.phase is Phase.FORMING

    def members(self) -> list[WorkerKey]:
        generation = self.sim.machine.generation
        if generation is None:
            return []
        return sorted(k for k in generation.members if k in self.sim.running)

    def spares(self) -> list[WorkerKey]:
        generation = self.sim.machine.generation
        return sorted(
            k
            for k, w in self.sim.running.items()
            if w.spawned_for is None and (generation is None or k not in generation.members)
        )

    # -- what happens ---------------------------------------------------------------------------

    @precondition(lambda self: self.live() and self.sim.waiting())
    @rule(data=st.data())
    def ask(self, data: st.DataObject) -> None:
        self.sim.ready(data.draw(st.sampled_from(self.sim.waiting())))

    @precondition(lambda self: self.live() and self.sim.assigned())
    @rule(data=st.data())
    def enter(self, data: st.DataObject) -> None:
        self.sim.enter(data.draw(st.sampled_from(self.sim.assigned())))

    @precondition(lambda self: self.live() and self.forming() and self.members())
    @rule(data=st.data())
    def member_dies_while_forming(self, data: st.DataObject) -> None:
        self.sim.fail(data.draw(st.sampled_from(self.members())), -9)

    @precondition(lambda self: self.live() and self.members())
    @rule(data=st.data(), returncode=st.sampled_from([1, -9, 0]))
    def member_exits(self, data: st.DataObject, returncode: int) -> None:
        self.sim.fail(data.draw(st.sampled_from(self.members())), returncode)

    @precondition(lambda self: self.live() and len(self.members()) >= 2)
    @rule(data=st.data())
    def two_die_at_once(self, data: st.DataObject) -> None:
        pair = data.draw(
            st.lists(st.sampled_from(self.members()), min_size=2, max_size=2, unique=True)
        )
        for key in pair:
            if self.live():
                self.sim.fail(key)

    @precondition(lambda self: self.live() and self.spares())
    @rule(data=st.data())
    def spare_dies(self, data: st.DataObject) -> None:
        self.sim.fail(data.draw(st.sampled_from(self.spares())), -9)

    @precondition(lambda self: self.live() and len(self.sim.specs) >= 1)
    @rule(data=st.data(), left=st.booleans())
    def node_lost(self, data: st.DataObject, left: bool) -> None:
        node = data.draw(st.sampled_from(sorted(self.sim.specs)))
        self.lost.append((node, self.sim.specs[node]))
        self.sim.lose_node(node, left=left)

    @precondition(lambda self: self.live() and self.lost)
    @rule(data=st.data())
    def lost_node_joins_again(self, data: st.DataObject) -> None:
        node, spec = data.draw(st.sampled_from(self.lost))
        if node not in self.sim.specs:
            self.lost.remove((node, spec))
            self.sim.join_node(node, spec)

    @precondition(lambda self: self.live() and self.sim.missed)
    @rule()
    def node_that_missed_the_beginning_joins(self) -> None:
        node = min(self.sim.missed)
        self.sim.join_node(node, self.began_with[node])
        assert self.sim.machine.phase is not Phase.FELL_BACK, self.sim.fallback

    @precondition(lambda self: self.live() and self.next_node < 5)
    @rule(size=st.integers(1, 2), spares=st.integers(0, 1))
    def new_node_joins(self, size: int, spares: int) -> None:
        self.sim.join_node(self.next_node, NodeSpec(size, spares))
        self.next_node += 1

    @precondition(lambda self: self.live() and self.members())
    @rule(data=st.data())
    def a_collective_fails(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.members()))
        if self.sim.running[key].place is not None:
            self.sim.trouble(key)

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.sim.advance(seconds)

    # -- the promises ---------------------------------------------------------------------------

    @invariant()
    def the_simulations_own_checks_hold(self) -> None:
        self.sim.check()

    @invariant()
    def ranks_are_dense_and_each_member_holds_one_world(self) -> None:
        generation = self.sim.machine.generation
        if generation is None:
            return
        assert len(set(generation.members)) == generation.world_size
        places = [
            w.places[-1] for w in self.sim.running.values() if w.places and w.place is not None
        ]
        current = [p for p in places if p.generation == generation.number]
        assert sorted(p.rank for p in current) == sorted({p.rank for p in current})
        assert all(0 <= p.rank < generation.world_size for p in current)
        for worker in self.sim.running.values():
            open_worlds = [p for p in worker.places if p.generation not in worker.ended]
            assert len(open_worlds) <= 1, (worker.key, worker.places, worker.ended)

    @invariant()
    def survivors_are_kept_while_a_spare_or_process_can_take_the_place(self) -> None:
        """Each new generation holds every member of the one before that still runs (only an
        eviction the machine reports takes a running member out), and a member's failure
        ends in a restart only for a storm or a job already ending."""
        commands = self.sim.commands
        new, self.checked = commands[self.checked :], len(commands)
        previous: Generation | None = None
        for command in commands[: len(commands) - len(new)]:
            if isinstance(command, GenerationAssigned):
                previous = command.generation
        evicted: set[WorkerKey] = set()
        for command in new:
            match command:
                case Evict():
                    assert command.cause in EvictCause
                    evicted.add(command.worker)
                case GenerationAssigned(generation=generation):
                    if previous is not None:
                        kept = {
                            k
                            for k in previous.members
                            if k in self.sim.running and k not in evicted
                        }
                        assert kept <= set(generation.members), (previous, generation)
                    previous = generation
                case FallBack(reason=reason) if PLAIN_FAILURE in reason:
                    assert any(why in reason for why in ALLOWED_AFTER_A_FAILURE), reason

    def teardown(self) -> None:
        """Once the processes stop misbehaving, the world settles: formed, or ended."""
        if not hasattr(self, "sim") or not self.live():
            return
        for node in sorted(self.sim.missed):
            self.sim.join_node(node, self.began_with[node])
        self.sim.enter_all()
        assert self.sim.machine.phase in (Phase.RUNNING, *TERMINAL_PHASES)


RandomRecoveries.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, suppress_health_check=[HealthCheck.too_slow]
)
test_random_recoveries = RandomRecoveries.TestCase


class RandomReplicatedRecoveries(RandomRecoveries):
    """The same over three agents' replicas fed through the log's codec (a late replica per
    node joining replays it): every replica decides alike."""

    replicas = 3


RandomReplicatedRecoveries.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, suppress_health_check=[HealthCheck.too_slow]
)
test_random_replicated_recoveries = RandomReplicatedRecoveries.TestCase


# -- the table is the spec ------------------------------------------------------------------------


def replica(**options: float) -> Replica:
    """Node 0's replica of a one-node world of two workers, begun."""
    core = Replica(0, recovery_timeout=10.0, **options)
    core.begin(Begin({0: NodeSpec(2)}, 1), 0.0)
    return core


@pytest.mark.parametrize(
    "event",
    [Entered(WorkerKey(0, 0), 1), Troubled(WorkerKey(0, 0), 1), TimedOut(1)],
    ids=["entered", "troubled", "timed-out"],
)
def test_an_event_the_table_does_not_allow_in_its_phase_is_a_protocol_error(
    event: Entered | Troubled | TimedOut,
) -> None:
    """Before anything was assigned nobody can enter, ask about or time out a world."""
    with pytest.raises(GenerationProtocolError, match=r"in phase WAITING: not accepted here"):
        replica().feed(LogEntry(event), 0.0)


def test_after_the_end_only_what_the_shell_still_reports_is_taken_in() -> None:
    """A finished world takes in exits (nothing changes) and refuses a worker asking again."""
    core = replica()
    for serial in (0, 1):
        core.feed(LogEntry(Ready(WorkerKey(0, serial))), 0.0)
    for serial in (0, 1):
        core.feed(LogEntry(Entered(WorkerKey(0, serial), 1)), 0.0)
    core.feed(LogEntry(Exited(WorkerKey(0, 0), 0)), 1.0)
    core.feed(LogEntry(Exited(WorkerKey(0, 1), 0)), 1.0)
    assert core.machine is not None
    assert core.machine.phase is Phase.FINISHED
    assert core.feed(LogEntry(Exited(WorkerKey(0, 1), 0)), 2.0) == []
    with pytest.raises(GenerationProtocolError, match=r"Ready .* in phase FINISHED"):
        core.feed(LogEntry(Ready(WorkerKey(0, 0))), 2.0)


def test_a_replica_starts_only_its_own_nodes_workers_and_defers_a_new_spare() -> None:
    """Each agent starts its own node's workers; a spare replacing one that took a place
    waits until the new world formed (starting it would hold the loop serving the store)."""
    core = Replica(1, recovery_timeout=10.0)
    started = core.begin(Begin({0: NodeSpec(1), 1: NodeSpec(1, spares=1)}, 1), 0.0)
    assert [c.worker.node for c in started if isinstance(c, Spawn)] == [1, 1]
    keys = [WorkerKey(0, 0), WorkerKey(1, 0), WorkerKey(1, 1)]
    for key in keys:
        core.feed(LogEntry(Ready(key)), 0.0)
    for key in keys[:2]:
        core.feed(LogEntry(Entered(key, 1)), 0.0)
    after = core.feed(LogEntry(Exited(WorkerKey(1, 0), -9)), 1.0)
    assert not any(isinstance(c, Spawn) for c in after)  # the spare took the place
    assert not any(isinstance(c, EndWorld) for c in after)  # no survivor on node 1 to tell
    core.feed(LogEntry(Entered(WorkerKey(0, 0), 2)), 1.0)
    formed = core.feed(LogEntry(Entered(WorkerKey(1, 1), 2)), 1.0)
    assert [type(c).__name__ for c in formed] == ["Spawn", "GenerationFormed"]


def test_two_failures_before_the_world_formed_start_every_member_the_replica_names() -> None:
    """The spare takes the first failed slot; the second failure, before that world formed,
    starts a process for its slot at once: every member of the generation is started (a
    member nobody starts would hold the world until its recovery timeout)."""
    core = Replica(0, recovery_timeout=10.0)
    done = core.begin(Begin({0: NodeSpec(2, spares=1)}, 1), 0.0)
    for key in [WorkerKey(0, 0), WorkerKey(0, 1), WorkerKey(0, 2)]:
        done += core.feed(LogEntry(Ready(key)), 0.0)
    for key in [WorkerKey(0, 0), WorkerKey(0, 1)]:
        done += core.feed(LogEntry(Entered(key, 1)), 0.0)
    done += core.feed(LogEntry(Exited(WorkerKey(0, 0), -9)), 1.0)
    done += core.feed(LogEntry(Exited(WorkerKey(0, 1), -9)), 1.0)
    machine = core.machine
    assert machine is not None
    assert machine.generation is not None
    started = {c.worker for c in done if isinstance(c, Spawn)}
    assert set(machine.generation.members) <= started, (machine.generation, started)


def test_a_generation_that_does_not_form_is_due_once_as_timed_out() -> None:
    """The replica's deadline says TimedOut once per generation, at recovery_timeout."""
    core = replica()
    for serial in (0, 1):
        core.feed(LogEntry(Ready(WorkerKey(0, serial))), 0.0)
    assert core.next_due() == 10.0
    assert core.due(9.0) == []
    assert core.due(10.0) == [TimedOut(1)]
    assert core.next_due() == float("inf")


def test_a_round_without_some_of_the_epochs_nodes_makes_them_lost() -> None:
    """Nodes of the epoch missing from a later round are logged lost; the others are not."""
    core = Replica(0, recovery_timeout=10.0, replicated=True)
    core.begin(Begin({0: NodeSpec(1), 1: NodeSpec(1), 2: NodeSpec(1)}, 1), 0.0)
    assert core.saw_round({0, 2}) == [NodeLost(1)]
    assert core.saw_round({0, 1, 2}) == []


def test_a_replaying_replica_logs_no_loss_and_no_leaving() -> None:
    """Until its own arrival is read back, a joining replica reports nothing of the others."""
    core = Replica(3, recovery_timeout=10.0, replicated=True, token="me")
    arrival = core.join(Begin({0: NodeSpec(1)}, 1), NodeSpec(1), 0.0)
    assert arrival == [NodeLost(3), NodeJoined(3, NodeSpec(1))]
    assert core.saw_node_lost(0) == []
    assert core.saw_round(set()) == []
    assert core.saw_leaving() is None
    core.feed(LogEntry(arrival[0], "me"), 0.0)
    core.feed(LogEntry(arrival[1], "me"), 0.0)
    assert not core.replaying
    assert core.saw_node_lost(0) == [NodeLost(0)]
    assert core.saw_leaving() == NodeLost(3, left=True)


def test_a_node_the_epoch_began_with_that_never_ran_it_joins_generation_1() -> None:
    """The round that began the epoch ended under node 0 in its slot exchange: node 1 began it
    and its worker asks; node 0's agent, never having run it, only joins (no earlier life to
    call lost), starts the workers the beginning gave it, and generation 1 holds both."""
    sim = WorldSimulation({0: NodeSpec(1, 1), 1: NodeSpec(1)}, replicas=2, missed={0})
    assert set(sim.running) == {WorkerKey(1, 0)}
    sim.ready_all()
    sim.join_node(0, NodeSpec(1, 1))
    assert set(sim.running) == {WorkerKey(1, 0), WorkerKey(0, 0), WorkerKey(0, 1)}
    sim.enter_all()
    assert sim.fallback is None
    generation = sim.machine.generation
    assert generation is not None
    assert (generation.number, generation.members) == (1, (WorkerKey(0, 0), WorkerKey(1, 0)))
    assert sim.machine.phase is Phase.RUNNING


def test_an_agent_that_ran_the_epoch_joins_it_again_as_a_lost_node() -> None:
    """A node of the epoch's beginning whose agent ran it (its workers there are gone) says
    its earlier life is lost before it joins: before generation 1 that falls back."""
    began = Begin({0: NodeSpec(1), 1: NodeSpec(1)}, 1)
    core = Replica(0, recovery_timeout=10.0, replicated=True, token="me")
    assert core.join(began, NodeSpec(1), 0.0) == [NodeLost(0), NodeJoined(0, NodeSpec(1))]
    fresh = Replica(0, recovery_timeout=10.0, replicated=True, token="me")
    assert fresh.join(began, NodeSpec(1), 0.0, ran_it=False) == [NodeJoined(0, NodeSpec(1))]
    other = Replica(2, recovery_timeout=10.0, replicated=True, token="me")
    assert other.join(began, NodeSpec(1), 0.0, ran_it=False)[0] == NodeLost(2)


def test_a_node_whose_workers_were_heard_cannot_join_again_without_being_lost() -> None:
    """NodeJoined of a node already in the job is a protocol error once one of its workers
    asked (its agent ran them), or with another spec, or after generation 1 was assigned."""
    core = Replica(1, recovery_timeout=10.0, replicated=True)
    core.begin(Begin({0: NodeSpec(1), 1: NodeSpec(1)}, 1), 0.0)
    with pytest.raises(GenerationProtocolError, match="node 0 is already in the job"):
        core.feed(LogEntry(NodeJoined(0, NodeSpec(2))), 0.0)
    core.feed(LogEntry(Ready(WorkerKey(0, 0))), 0.0)
    with pytest.raises(GenerationProtocolError, match="node 0 is already in the job"):
        core.feed(LogEntry(NodeJoined(0, NodeSpec(1))), 0.0)
