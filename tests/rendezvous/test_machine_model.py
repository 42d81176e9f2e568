"""Model-based test: many JoinMachines over a model store, with random faults and time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous import _machine as m

S = TypeVar("S", bound=m.CompareSetStep)

KEEP_ALIVE = 5.0
HEARTBEAT = 15.0


class ModelStore:
    """The store semantics the algorithm relies on, as a dict with revisions and TTLs."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.expiry: dict[str, float] = {}
        self.changed: dict[str, int] = {}
        self.revision = 0

    def _touch(self, key: str) -> None:
        self.revision += 1
        self.changed[key] = self.revision

    def expire(self, now: float) -> None:
        for key, deadline in list(self.expiry.items()):
            if deadline <= now:
                del self.expiry[key]
                del self.data[key]
                self._touch(key)

    def set(self, key: str, value: bytes, ttl: float | None = None, now: float = 0.0) -> None:
        self.data[key] = value
        self.expiry.pop(key, None)
        if ttl is not None:
            self.expiry[key] = now + ttl
        self._touch(key)

    def multi_set_and_count(self, keys: list[str], values: list[bytes], prefix: str) -> int:
        """etcd's transaction of puts and a count-only range read: the count sees the puts."""
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)
        return sum(1 for key in self.data if key.startswith(prefix))

    def add(self, key: str, amount: int) -> int:
        total = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(total).encode()
        self._touch(key)
        return total

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if (current is None and expected == b"") or current == expected:
            self.data[key] = desired
            self._touch(key)
            return desired
        return expected if current is None else current

    def delete(self, key: str) -> None:
        if key in self.data:
            del self.data[key]
            self.expiry.pop(key, None)
            self._touch(key)

    def prefix(self, prefix: str) -> dict[str, bytes]:
        return {k: v for k, v in self.data.items() if k.startswith(prefix)}

    def changed_since(self, prefix: str, revision: int) -> bool:
        return any(rev > revision and k.startswith(prefix) for k, rev in self.changed.items())


@dataclass
class SimNode:
    """A handler in the simulation: its machine, its pending command, what it completed."""

    node: int
    healthy: bool = True
    machine: m.JoinMachine | None = None
    pending: m.Command | None = None
    previous: tuple[int, int] = (0, -1)
    started_at: float = 0.0
    outcomes: list[m.Command] = field(default_factory=list)


class RendezvousModel(RuleBasedStateMachine):
    """Random joins, leaves, crashes, restarts, closes and time; invariants after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.store = ModelStore()
        self.now = 0.0
        self.nodes: dict[int, SimNode] = {}
        self.next_id = 1
        self.closed_at: int | None = None  # store revision at close
        self.sealed_at: dict[int, float] = {}
        self.min_reached_at: dict[int, float] = {}
        self.records: dict[int, dict[int, layout.JoinRecord]] = {}
        self.completions: list[tuple[int, int, int, tuple[int, ...]]] = []
        self.deferred: list[m.AdvanceLatest] = []  # compare-and-sets issued, not yet applied
        self.latest_seen = 0

    @initialize(
        min_nodes=st.integers(1, 3),
        extra=st.integers(0, 2),
        last_call=st.sampled_from([0.0, 4.0, 12.0]),
        counts_keys=st.booleans(),
    )
    def configure(self, min_nodes: int, extra: int, last_call: float, counts_keys: bool) -> None:
        self.policy = m.RoundPolicy(min_nodes, min_nodes + extra, 20.0, last_call)
        # Whether the store counts keys as it writes (etcd: an arrival number is a count of
        # join records, and numbers may repeat) or has an atomic add (memory, TCP: a counter).
        self.counts_keys = counts_keys

    # -- faults and arrivals -------------------------------------------------------------

    @rule()
    def spawn(self) -> None:
        """A new node (a new process, or a restarted one) starts and joins."""
        node = SimNode(self.next_id)
        self.next_id += 1
        self.nodes[node.node] = node
        self.store.set(layout.alive_key(node.node), b"1", ttl=HEARTBEAT, now=self.now)
        self._begin(node)

    def _idle(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.healthy and n.machine is None]

    def _busy(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.healthy and n.machine is not None]

    @precondition(lambda self: self._idle())
    @rule(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        """An idle node (it completed or failed a round) calls next_rendezvous again."""
        self._begin(data.draw(st.sampled_from(self._idle())))

    @precondition(lambda self: len(self._idle()) >= 2)
    @rule()
    def regroup(self) -> None:
        """Every idle node re-joins at once (agents restarting after an invalidated round)."""
        for node in self._idle():
            self._begin(node)

    def _begin(self, node: SimNode) -> None:
        node.machine = m.JoinMachine(
            self.policy,
            node.node,
            f"host{node.node}",
            1000 + node.node,
            node.previous,
            read_state_on_arrival=self.counts_keys,  # as the shell does: one step fewer
        )
        node.started_at = self.now
        node.pending = node.machine.start(self.now)

    @precondition(lambda self: [n for n in self.nodes.values() if n.healthy])
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A node dies: no more heart-beats, its pending work is lost."""
        node = data.draw(st.sampled_from([n for n in self.nodes.values() if n.healthy]))
        node.healthy = False
        node.machine = node.pending = None

    @precondition(lambda self: [n for n in self.nodes.values() if n.healthy])
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        """A node shuts down gracefully: withdraws, reports itself gone, deletes its key."""
        node = data.draw(st.sampled_from([n for n in self.nodes.values() if n.healthy]))
        if node.machine is not None and node.machine.may_hold_join_record:
            self.store.delete(layout.join_key(node.machine.round, node.node))
        if node.previous[0]:
            self.store.set(layout.lost_key(node.previous[0] + 1, node.node), b"left")
            self.store.add(layout.count_key(node.previous[0] + 1), 0)  # ring the doorbell
        self.store.delete(layout.alive_key(node.node))
        node.healthy = False
        node.machine = node.pending = None

    @precondition(lambda self: self.closed_at is None and len(self.sealed_at) >= 2)
    @rule()
    def close(self) -> None:
        """Someone calls set_closed (once a few rounds have formed, to leave room for them)."""
        self.store.set(layout.CLOSED_KEY, b"1")
        last = m.CloseRound(int(self.store.data.get(layout.LATEST_KEY, b"0")) + 1)
        while (step := self._compare_set(last)) is not None:
            last = step
        self.store.add(layout.count_key(last.round), 0)  # ring the doorbell
        self.closed_at = self.store.revision

    @rule(dt=st.sampled_from([0.5, 2.0, KEEP_ALIVE]))
    def tick(self, dt: float) -> None:
        """Time passes; healthy nodes keep their liveness keys fresh."""
        self.now += dt
        self.store.expire(self.now)
        for node in self.nodes.values():
            if node.healthy:
                self.store.set(layout.alive_key(node.node), b"1", ttl=HEARTBEAT, now=self.now)

    # -- executing commands ---------------------------------------------------------------

    def _ready(self) -> list[SimNode]:
        return [n for n in self._busy() if self._outcome(n, dry_run=True) is not None]

    @precondition(lambda self: self._ready())
    @rule(data=st.data(), steps=st.integers(1, 8))
    def step(self, data: st.DataObject, steps: int) -> None:
        """Nodes whose commands can proceed perform them, in a random interleaving."""
        for _ in range(steps):
            ready = self._ready()
            if not ready:
                return
            self.execute(data.draw(st.sampled_from(ready)))

    def execute(self, node: SimNode) -> None:
        assert node.machine is not None
        event = self._outcome(node, dry_run=False)
        assert event is not None
        node.pending = node.machine.send(event, self.now)
        if isinstance(node.pending, m.Finish | m.Fail):
            self._finish(node, node.pending)

    @precondition(lambda self: self.deferred)
    @rule(data=st.data())
    def flush(self, data: st.DataObject) -> None:
        """A delayed compare-and-set of a publisher advancing ``state/latest`` lands, in any
        order with the others; the publisher's next one (if any) is issued."""
        step = self._compare_set(
            self.deferred.pop(data.draw(st.integers(0, len(self.deferred) - 1)))
        )
        if step is not None:
            self.deferred.append(step)

    def _compare_set(self, step: S) -> S | None:
        """Apply one step of the machine's compare-and-set loops; return the next."""
        return step.then(self.store.compare_set(step.key, step.expected, step.desired))

    def _outcome(self, node: SimNode, *, dry_run: bool) -> m.Event | None:
        """The event ``node``'s pending command produces now, or None while it must wait."""
        store, command = self.store, node.pending
        match command:
            case m.ReadState():
                return self._state(store)
            case m.Arrive(round_, record, read_state):
                if dry_run:
                    return m.Arrived(0)
                self.records.setdefault(round_, {})[record.node] = record
                if self.counts_keys:
                    keys, values, counted = layout.counted_arrival(round_, record)
                    arrival = store.multi_set_and_count(keys, values, counted)
                else:
                    store.set(layout.join_key(round_, record.node), record.encode())
                    arrival = store.add(layout.count_key(round_), 1)
                if arrival >= self.policy.min_nodes:  # the arrivals say min_nodes are in
                    self.min_reached_at.setdefault(round_, self.now)
                # (the state as the arrival's own step saw it, after its writes)
                return m.Arrived(arrival, self._state(store) if read_state else None)
            case m.AwaitResult(round_, deadline):
                value = store.data.get(layout.result_key(round_))
                if value is not None:
                    return m.ResultSeen(value)
                return m.DeadlineReached() if self.now >= deadline else None
            case m.ReadCandidates(round_):
                records = layout.parse_records(store.prefix(layout.join_prefix(round_)))
                alive = layout.parse_alive(store.prefix(layout.alive_prefix()))
                return m.Candidates(records, alive, store.revision)
            case m.Publish(round_, value):
                if dry_run:
                    return m.Published(value)
                first = layout.result_key(round_) not in store.data
                stored = store.compare_set(layout.result_key(round_), b"", value)
                if first and stored == value:
                    self.sealed_at[round_] = self.now
                    if self.closed_at is not None:
                        raise AssertionError(f"round {round_} sealed after the close")
                    self.deferred.append(m.AdvanceLatest.first(round_))
                return m.Published(stored)
            case m.AwaitJoins(round_, deadline, _, after):
                value = store.data.get(layout.result_key(round_))
                if value is not None:
                    return m.ResultSeen(value)
                if store.changed_since(layout.round_prefix(round_), after):
                    return m.JoinsChanged()
                return m.DeadlineReached() if self.now >= deadline else None
            case m.Withdraw(round_, who):
                records = layout.parse_records(store.prefix(layout.join_prefix(round_)))
                alive = layout.parse_alive(store.prefix(layout.alive_prefix()))
                live = len(m.live_joiners(records, alive))
                if not dry_run:
                    store.delete(layout.join_key(round_, who))
                return m.Withdrawn(store.data.get(layout.result_key(round_)), live)
        raise AssertionError(command)

    @staticmethod
    def _state(store: ModelStore) -> m.StateRead:
        latest = int(store.data.get(layout.LATEST_KEY, b"0"))
        return m.StateRead(latest, layout.CLOSED_KEY in store.data)

    def _finish(self, node: SimNode, outcome: m.Finish | m.Fail) -> None:
        node.outcomes.append(outcome)
        node.machine = None
        if isinstance(outcome, m.Finish):
            result = outcome.result
            self.completions.append((node.node, result.round, outcome.rank, result.members))
            node.previous = (result.round, outcome.rank)
        elif outcome.reason is m.FailReason.TIMED_OUT:
            assert self.now >= node.started_at + self.policy.join_timeout

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def results_are_well_formed(self) -> None:
        """Every sealed round has min..max unique members who joined it, ranks 0..n-1."""
        for key, value in self.store.prefix("round/").items():
            if not key.endswith("/result") or value == layout.CLOSED_RESULT:
                continue
            round_ = int(key.split("/")[1])
            result = layout.RoundResult.decode(round_, value)
            members = result.members
            assert self.policy.min_nodes <= len(members) <= self.policy.max_nodes
            assert len(set(members)) == len(members)
            assert set(members) <= set(self.records[round_])
            if len(members) < self.policy.max_nodes:
                assert self.sealed_at[round_] >= (
                    self.min_reached_at[round_] + self.policy.last_call_timeout
                )

    @invariant()
    def the_doorbell_rings_with_the_inbox(self) -> None:
        """Whatever a round's keys hold (a join record, a loss, a result), its doorbell (the
        counter key) is there too: the last round's members wait for that one key."""
        rounds = {int(key.split("/")[1]) for key in self.store.prefix("round/")}
        for round_ in rounds:
            assert layout.count_key(round_) in self.store.data, f"round {round_} rang no bell"

    @invariant()
    def everyone_sees_the_same_round(self) -> None:
        """Each completion matches the stored result: same members, rank = position."""
        for node, round_, rank, members in self.completions:
            stored = layout.RoundResult.decode(round_, self.store.data[layout.result_key(round_)])
            assert stored.members == members
            assert members[rank] == node

    @invariant()
    def latest_never_moves_back(self) -> None:
        """``state/latest`` only moves forward, whatever order the publishers' writes land in."""
        latest = int(self.store.data.get(layout.LATEST_KEY, b"0"))
        assert latest >= self.latest_seen
        self.latest_seen = latest

    @invariant()
    def nodes_complete_rounds_in_order(self) -> None:
        """A node completes each round once, and a later round after an earlier one, even when
        ``state/latest`` writes land late and out of order."""
        last: dict[int, int] = {}
        for node, round_, _, _ in self.completions:
            assert round_ > last.get(node, 0), f"node {node} completed round {round_} again"
            last[node] = round_

    @invariant()
    def previous_members_keep_their_rank(self) -> None:
        """A member of round k-1 in round k keeps its rank when it is below the new size."""
        results = {
            int(k.split("/")[1]): layout.RoundResult.decode(int(k.split("/")[1]), v)
            for k, v in self.store.prefix("round/").items()
            if k.endswith("/result") and v != layout.CLOSED_RESULT
        }
        for round_, result in results.items():
            before = results.get(round_ - 1)
            if before is None:
                continue
            for node in result.members:
                old = before.rank_of(node)
                record = self.records[round_][node]
                if old is not None and record.prev_round == round_ - 1:
                    assert record.prev_rank == old
                    if old < result.world_size:
                        assert result.rank_of(node) == old

    def teardown(self) -> None:
        """With faults stopped: joining nodes finish (no deadlock); once the crashed nodes'
        keys expired, min_nodes fresh nodes form a round whatever arrival numbers and records
        the crashed ones left; once the publishers' loops end, ``state/latest`` is the last
        sealed round; a lost member shows in the survivors' inbox."""
        if not hasattr(self, "policy"):
            return
        self._flush_all()
        self._drain()
        self.tick(HEARTBEAT)  # the crashed nodes' keys expire: only the fresh nodes are live
        fresh = [self.next_id + i for i in range(self.policy.min_nodes)]
        for _ in fresh:
            self.spawn()
        self._drain()
        for node in fresh:
            outcome = self.nodes[node].outcomes
            expected = m.Fail if self.closed_at is not None else m.Finish
            assert len(outcome) == 1, f"node {node} did not finish: {outcome}"
            assert isinstance(outcome[0], expected), f"min_nodes fresh nodes failed: {outcome}"
        self._flush_all()
        latest = int(self.store.data.get(layout.LATEST_KEY, b"0"))
        assert latest == max(self.sealed_at, default=0), "state/latest is not the last sealed round"
        self.results_are_well_formed()
        self.everyone_sees_the_same_round()
        self._check_ring_reports_losses()

    def _flush_all(self) -> None:
        """Run every publisher's compare-and-set loop to its end."""
        while self.deferred:
            step = self._compare_set(self.deferred.pop())
            if step is not None:
                self.deferred.append(step)

    def _drain(self) -> None:
        """Run every healthy joining node to its end, moving time when nobody can proceed."""
        deadline = self.now + self.policy.join_timeout + 2 * HEARTBEAT
        while self._busy():
            ready = self._ready()
            if ready:
                self.execute(ready[0])
            else:
                assert self.now <= deadline, f"deadlock: {[n.pending for n in self._busy()]}"
                self.tick(1.0)

    def _check_ring_reports_losses(self) -> None:
        latest = int(self.store.data.get(layout.LATEST_KEY, b"0"))
        value = self.store.data.get(layout.result_key(latest))
        if latest == 0 or value is None or value == layout.CLOSED_RESULT:
            return
        self.tick(HEARTBEAT)  # every dead node's key has expired now
        members = layout.RoundResult.decode(latest, value).members
        watchers = [
            self.nodes[n]
            for n in members
            if self.nodes[n].healthy and self.nodes[n].previous[0] == latest
        ]
        for watcher in watchers:
            successor = m.ring_successor(members, watcher.node)
            if successor is not None and layout.alive_key(successor) not in self.store.data:
                self.store.set(layout.lost_key(latest + 1, successor), b"lost")
                self.store.add(layout.count_key(latest + 1), 0)
        dead = [n for n in members if layout.alive_key(n) not in self.store.data]
        inbox = self.store.prefix(layout.round_prefix(latest + 1))
        for watcher in watchers:
            verdict = m.assess_inbox(members, latest, inbox)
            if dead:
                assert verdict is not None, (watcher.node, dead)
            elif verdict is None:
                assert not inbox or set(inbox) == {layout.count_key(latest + 1)}


RendezvousModel.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRendezvousModel = RendezvousModel.TestCase
