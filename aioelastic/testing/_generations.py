"""A whole job's world in one object: the agents' replicas driven like the agents drive them.

:class:`WorldSimulation` runs the agents' own core, :class:`~aioelastic.agent._replica.Replica`
(the :class:`~aioelastic.agent._generations.GenerationMachine` and the agents' timers), against
simulated worker processes and a manual clock, and checks the protocol's promises after every
step (:meth:`WorldSimulation.check`), so a test (or a hypothesis state machine) only says what
happens to the processes:

```python
sim = WorldSimulation({0: NodeSpec(4, spares=1)})
sim.ready_all(); sim.enter_all()            # generation 1 formed
sim.fail(sim.member(2))                     # rank 2 dies: its spare takes the slot
sim.enter_all()
assert sim.machine.generation.number == 2
```

Every event goes through a log that every replica is fed from, as in the agent. With
``replicas=N`` the simulation is a job over many agents: the log's entries go through its codec,
each replica has a clock of its own (an offset), and every replica must decide exactly what the
first one does. A node that joins gets a late replica that replays the whole log first, as a
joining agent does (:meth:`~aioelastic.agent._replica.Replica.join`). Time passing fires each
replica's own deadlines (:meth:`~aioelastic.agent._replica.Replica.due`): a generation that did
not form, and with ``leave_timeout`` a survivor of its node that did not leave its ended world.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from aioelastic.agent._generations import (
    LEAVE_CAUSES,
    TERMINAL_PHASES,
    Assign,
    Begin,
    Command,
    EndWorld,
    Event,
    Evict,
    EvictCause,
    FallBack,
    Finish,
    Generation,
    GenerationAssigned,
    GenerationFormed,
    GenerationMachine,
    LeaveDue,
    LogEntry,
    NodeJoined,
    NodeLost,
    NodeOut,
    NodeSpec,
    OwnError,
    Phase,
    Place,
    Spawn,
    Stop,
    Troubled,
    VerdictDue,
    WorkerKey,
    decode_entry,
    encode_entry,
)
from aioelastic.agent._replica import Replica
from aioelastic.testing._clock import ManualClock


@dataclass(slots=True)
class SimulatedWorker:
    """A simulated worker process and what it was told."""

    key: WorkerKey
    spawned_for: int | None
    asked: bool = False
    places: list[Place] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)
    troubled: set[int] = field(default_factory=set)
    """Generations in which it asked whether its world ended (an exception in ``with``)."""
    own_error: set[int] = field(default_factory=set)
    """Generations in which it was told its error is its own."""

    @property
    def place(self) -> Place | None:
        """Its place in the newest generation it was given, unless that one ended."""
        if self.places and self.places[-1].generation not in self.ended:
            return self.places[-1]
        return None


def _decisions(commands: list[Command]) -> list[Command]:
    return [
        replace(c, since_failure=None) if isinstance(c, GenerationFormed) else c for c in commands
    ]


class ProtocolViolation(AssertionError):
    """The generation machine broke one of its promises (the message says which)."""


class WorldSimulation:
    """A job's workers and the agents' replicas that look after them (see the module).

    ``leave_timeout``: how long a survivor told that its world ended has to enter the next
    before its agent reports it stuck (default: never by itself; :meth:`stuck` says so).
    ``missed``: nodes the epoch begins with whose agents missed its beginning (the round ended
    under them in the slot exchange): none of their workers starts until :meth:`join_node`.
    """

    def __init__(
        self,
        nodes: Mapping[int, NodeSpec],
        *,
        recovery_timeout: float = 30.0,
        replicas: int = 1,
        leave_timeout: float = math.inf,
        missed: Collection[int] = (),
    ) -> None:
        if replicas < 1:
            raise ValueError(f"a simulation needs at least one replica, got {replicas!r}")
        self.missed = set(missed)
        """Nodes whose agents missed the epoch's beginning and did not join yet."""
        if not self.missed < set(nodes):
            raise ValueError(f"missed nodes {sorted(missed)} must be some of {sorted(nodes)}")
        self.clock = ManualClock()
        self.specs = {n: spec for n, spec in nodes.items() if n not in self.missed}
        self.recovery_timeout = recovery_timeout
        self.leave_timeout = leave_timeout
        self._begin = Begin(dict(nodes), 1)
        self._replicated = replicas > 1
        order = sorted(self.specs)
        self.agents = [self._replica(order[i % len(order)], i) for i in range(replicas)]
        """Each agent's replica (the first one's decisions are the simulation's)."""
        self.log: list[bytes] = []
        """The generation log so far (replicated simulations only)."""
        self.running: dict[WorkerKey, SimulatedWorker] = {}
        self.exited: dict[WorkerKey, int] = {}
        self.generations: list[Generation] = []
        self.formed: list[GenerationFormed] = []
        self.fallback: str | None = None
        self.finished = False
        self.commands: list[Command] = []
        self._entries = 0
        for index, agent in enumerate(self.agents):
            agent.begin(self._begin, self._their_now(index))
            self._agree(index, self.agents[0].decided, agent.decided)
        self._apply([c for c in self.agents[0].decided if not self._missing(c)])

    def _missing(self, command: Command) -> bool:
        """Whether ``command`` starts a worker on a node whose agent missed the beginning."""
        return isinstance(command, Spawn) and command.worker.node in self.missed

    def _replica(self, node: int, index: int) -> Replica:
        replica = Replica(
            node,
            recovery_timeout=self.recovery_timeout,
            replicated=self._replicated,
            token=f"agent-{index}",
            leave_timeout=self.leave_timeout,
        )
        return replica

    @property
    def machine(self) -> GenerationMachine:
        """The first agent's machine: what the simulation checks."""
        machine = self.agents[0].machine
        assert machine is not None
        return machine

    @property
    def replicas(self) -> list[GenerationMachine]:
        """The other agents' machines (``replicas=N``), each fed every logged event."""
        return [a.machine for a in self.agents[1:] if a.machine is not None]

    # -- what happens to the processes ---------------------------------------------------------

    def ready(self, key: WorkerKey) -> None:
        """``key`` calls ``worker.worlds()``."""
        self.running[key].asked = True
        self._send(self._agent_of(key.node).saw_hello(key))

    def enter(self, key: WorkerKey) -> None:
        """``key`` enters the world it was given (``with world:``)."""
        place = self.running[key].place
        if place is None:
            raise ValueError(f"worker {key} has no world to enter")
        self._send(self._agent_of(key.node).saw_enter(key, place.generation))

    def fail(self, key: WorkerKey, returncode: int = 1) -> None:
        """``key``'s process dies (``returncode`` 0: it finished)."""
        del self.running[key]
        self.exited[key] = returncode
        self._send(self._agent_of(key.node).saw_exit(key, returncode))

    def lose_node(self, node: int, *, left: bool = False) -> None:
        """``node``'s agent dies (``left``: it stops and says so): its workers die with it."""
        for key in [k for k in self.running if k.node == node]:
            del self.running[key]
            self.exited[key] = -9
        self.specs.pop(node, None)
        self.missed.discard(node)
        self._send(NodeLost(node, left=left))

    def take_for_lost(self, node: int) -> None:
        """``node``'s agent lives on, but the job took it for lost (it missed a round): its
        workers still run until the machine tells their agent to stop them."""
        self.specs.pop(node, None)
        self._send(NodeLost(node))

    def join_node(self, node: int, spec: NodeSpec) -> None:
        """A new node's agent joins the job (replicated: a replica that replays the log first,
        then logs that the node's earlier life is lost and that it joins); or the agent of a
        node that missed the epoch's beginning, which has no earlier life there."""
        missed = node in self.missed
        self.missed.discard(node)
        if not self._replicated:
            self.specs[node] = spec
            self._send(NodeJoined(node, spec))
            return
        late = self._replica(node, len(self.agents))
        arrival = late.join(self._begin, spec, self.clock.now(), ran_it=not missed)
        for raw in self.log:
            late.feed(decode_entry(raw), self.clock.now())
        self.agents.append(late)
        *lost, joined = arrival
        for event in lost:
            self._send(event, by=late.token)
        self.specs[node] = spec
        self._send(joined, by=late.token)

    def trouble(self, key: WorkerKey) -> None:
        """An exception leaves ``key``'s ``with world:``: it asks whether its world ended."""
        place = self.running[key].place
        if place is None:
            raise ValueError(f"worker {key} is in no world")
        self.running[key].troubled.add(place.generation)
        self._send(Troubled(key, place.generation))

    def verdict_due(self, key: WorkerKey, *, final: bool = True) -> None:
        """``key``'s agent waited long enough for the world it asked about to end."""
        troubled = self.running[key].troubled
        if not troubled:
            raise ValueError(f"worker {key} never asked whether its world ended")
        self._send(VerdictDue(key, max(troubled), final))

    def stuck(
        self, key: WorkerKey, cause: EvictCause = EvictCause.DID_NOT_LEAVE, detail: str = ""
    ) -> None:
        """``key``'s agent says it is not out of the newest world it was told ended (it did not
        leave in time, or it cannot abort); the machine decides whether it is still stuck."""
        if cause not in LEAVE_CAUSES:
            causes = ", ".join(c.name for c in LEAVE_CAUSES)
            raise ValueError(f"a leave deadline never says {cause.name}, only {causes}")
        ended = self.running[key].ended
        if not ended:
            raise ValueError(f"worker {key} was never told that a world ended")
        self._send(LeaveDue(key, max(ended), cause, detail))

    def advance(self, seconds: float) -> None:
        """Time passes: what each agent's replica finds due is logged, in agent order."""
        self.clock.advance(seconds)
        for index, agent in enumerate(list(self.agents)):
            if agent.replaying or self.machine.phase in TERMINAL_PHASES:
                continue
            for event in agent.due(self._their_now(index)):
                if self.machine.phase not in TERMINAL_PHASES:
                    self._send(event, by=agent.token)

    # -- conveniences ---------------------------------------------------------------------------

    def waiting(self) -> list[WorkerKey]:
        """Running workers that have not asked for a world yet."""
        return [k for k, w in self.running.items() if not w.asked]

    def assigned(self) -> list[WorkerKey]:
        """Running workers holding a place in the current generation that they did not enter."""
        generation = self.machine.generation
        if generation is None:
            return []
        return [
            k
            for k, w in self.running.items()
            if w.place is not None and w.place.generation == generation.number
        ]

    def ready_all(self) -> None:
        """Every running worker that has not asked asks (until the world ends)."""
        for key in self.waiting():
            if key in self.running and self.machine.phase not in TERMINAL_PHASES:
                self.ready(key)

    def enter_all(self) -> None:
        """Everyone ready asks, and every assigned worker enters, until nothing changes."""
        while self.machine.phase not in TERMINAL_PHASES:
            before = len(self.commands)
            self.ready_all()
            for key in self.assigned():
                if self.machine.phase not in TERMINAL_PHASES:
                    self.enter(key)
            if len(self.commands) == before:
                return

    def member(self, rank: int) -> WorkerKey:
        """The worker holding ``rank`` in the current generation."""
        generation = self.machine.generation
        if generation is None:
            raise ValueError("no generation was assigned yet")
        return generation.members[rank]

    # -- the log and the replicas' promises ------------------------------------------------------

    def _agent_of(self, node: int) -> Replica:
        """The replica of ``node``'s agent (the first agent's where none is simulated)."""
        return next((a for a in self.agents if a.node == node), self.agents[0])

    def _send(self, event: Event, *, by: str = "sim") -> None:
        entry = LogEntry(event, by, self._entries)
        self._entries += 1
        if self._replicated:
            raw = encode_entry(entry)
            self.log.append(raw)
            entry = decode_entry(raw)
            if entry.event != event:
                raise ProtocolViolation(f"the log turned {event} into {entry.event}")
        for index, agent in enumerate(self.agents):
            agent.feed(entry, self._their_now(index))
            self._agree(index, self.agents[0].decided, agent.decided)
        commands = self.agents[0].decided
        self._apply(commands)
        self._killed(commands)

    def _killed(self, commands: list[Command]) -> None:
        """The shell kills what the machine evicted; its pidfd then reports the exit."""
        for command in commands:
            if isinstance(command, Evict):
                self._send(self._agent_of(command.worker.node).saw_exit(command.worker, -9))

    def _their_now(self, index: int) -> float:
        """Replica ``index``'s clock: another host's monotonic clock, far from ours."""
        return self.clock.now() + 1000.0 * index

    @staticmethod
    def _agree(index: int, ours: list[Command], theirs: list[Command]) -> None:
        """Replicas say the same, but for how long a recovery took (each by its own clock)."""
        if _decisions(ours) != _decisions(theirs):
            raise ProtocolViolation(f"replica {index} said {theirs}, the first said {ours}")

    def _apply(self, commands: list[Command]) -> None:
        for command in commands:
            self.commands.append(command)
            match command:
                case Spawn():
                    if command.worker in self.running or command.worker in self.exited:
                        raise ProtocolViolation(f"worker key {command.worker} spawned twice")
                    if command.worker.node not in self.specs:
                        raise ProtocolViolation(f"{command} on a node that is not in the job")
                    self.running[command.worker] = SimulatedWorker(command.worker, command.slot)
                case Assign():
                    self._check_assign(command)
                    self.running[command.worker].places.append(command.place)
                case EndWorld():
                    for key in command.workers:
                        worker = self.running.get(key)
                        if worker is None or not worker.places:
                            raise ProtocolViolation(f"{command} names {key}, which holds no place")
                        if worker.places[-1].generation != command.generation:
                            raise ProtocolViolation(f"{command} names {key} of another generation")
                        worker.ended.add(command.generation)
                case GenerationAssigned():
                    self._check_generation(command.generation)
                    self.generations.append(command.generation)
                case GenerationFormed():
                    self.formed.append(command)
                case Evict():
                    worker = self.running.pop(command.worker, None)
                    if worker is None:
                        raise ProtocolViolation(f"{command} names a worker that is not running")
                    if command.cause is EvictCause.HUNG and command.generation in worker.troubled:
                        raise ProtocolViolation(f"{command} evicts a worker that asked")
                    self.exited[command.worker] = -9
                case OwnError():
                    worker = self.running.get(command.worker)
                    if worker is None or command.generation not in worker.troubled:
                        raise ProtocolViolation(f"{command} to a worker that did not ask")
                    worker.own_error.add(command.generation)
                case Stop():
                    pass
                case NodeOut():  # its agent stops its workers: their places are given away
                    if command.node in self.specs:
                        raise ProtocolViolation(f"{command} names a node the job holds")
                    for key in [k for k in self.running if k.node == command.node]:
                        del self.running[key]
                        self.exited[key] = -9
                case FallBack():
                    self.fallback = command.reason
                case Finish():
                    self.finished = True
        self.check()

    def _check_generation(self, new: Generation) -> None:
        previous = self.generations[-1] if self.generations else None
        if previous is not None and new.number <= previous.number:
            raise ProtocolViolation(f"generation {new.number} after {previous.number}")
        if len(set(new.members)) != len(new.members):
            raise ProtocolViolation(f"generation {new.number} holds a worker twice: {new.members}")
        places = set(zip((k.node for k in new.members), new.slots, strict=True))
        if len(places) != len(new.members):
            raise ProtocolViolation(f"generation {new.number} holds a slot twice")
        for key in new.members:
            if key not in self.running:
                raise ProtocolViolation(
                    f"generation {new.number} holds {key}, which is not running"
                )
        for node in {k.node for k in new.members}:
            slots = sorted(s for k, s in zip(new.members, new.slots, strict=True) if k.node == node)
            if slots != list(range(self.specs[node].local_world_size)):
                raise ProtocolViolation(f"generation {new.number}: node {node} has slots {slots}")
        if previous is not None:
            for rank, key in enumerate(previous.members):
                if key in new.members and rank < new.world_size and new.members[rank] != key:
                    raise ProtocolViolation(
                        f"worker {key} lost rank {rank} in generation {new.number}"
                    )
        formed = [f.generation for f in self.formed]
        for key in new.fresh:
            if formed and key in formed[-1].members:
                raise ProtocolViolation(f"{key} is fresh but was in generation {formed[-1].number}")

    def _check_assign(self, command: Assign) -> None:
        worker = self.running.get(command.worker)
        if worker is None:
            raise ProtocolViolation(f"{command} to a worker that is not running")
        if not worker.asked:
            raise ProtocolViolation(f"{command} to a worker that did not ask for a world")
        if worker.places and worker.places[-1].generation >= command.place.generation:
            raise ProtocolViolation(f"{command} after generation {worker.places[-1].generation}")
        generation = self.machine.generation
        if generation is None or generation.number != command.place.generation:
            raise ProtocolViolation(f"{command} is not for the current generation")
        if generation.place_of(command.worker) != command.place:
            raise ProtocolViolation(f"{command} does not match the generation's ranks")

    def check(self) -> None:
        """The promises that hold between any two steps."""
        phase = self.machine.phase
        if phase in (Phase.FINISHED, Phase.FELL_BACK):
            return
        generation = self.machine.generation
        if generation is not None:
            for key in generation.members:
                if key not in self.running and self.exited.get(key) != 0:
                    raise ProtocolViolation(
                        f"{key} is in generation {generation.number} but not running"
                    )
        for key in self.running:
            if key.node not in self.specs:
                raise ProtocolViolation(f"{key} runs on node {key.node}, which left the job")
        for node, spec in self.specs.items():
            spares = [
                k
                for k, w in self.running.items()
                if k.node == node
                and w.spawned_for is None
                and (generation is None or k not in generation.members)
            ]
            lacking = spec.spares - len(spares)  # while a generation forms, started after it
            if lacking < 0 or (lacking and phase is not Phase.FORMING):
                raise ProtocolViolation(f"node {node} has {len(spares)} spares, not {spec.spares}")
        for formed in self.formed:
            if formed.since_failure is not None and formed.since_failure < 0:
                raise ProtocolViolation(f"{formed} reports a negative time")
