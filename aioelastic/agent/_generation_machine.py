"""The generation protocol: a pure state machine and its table (see ``_generations.py``
for where the rest of in-place recovery lives).

Theory of operation. Besides rendezvous *rounds* between agents, a job has *generations* of its
workers' world, numbered 1, 2, ... and never reused. A generation is a list of workers in rank
order (ranks are dense, 0..N-1), each holding one *slot* (its local rank) on its node. The
:class:`GenerationMachine` is the single source of truth about them; it does no I/O and reads
no clock (every call takes ``now``). The shell feeds it what happened (:data:`Event`) and does
what it returns (:data:`Command`): start a process, tell a worker its place or that its world
ended, stop a worker, report.

* **Waiting.** The first workers (one per slot) and the spares are started together. Each worker
  that calls ``worker.worlds()`` says it is :class:`Ready`. Once every slot's worker is ready,
  generation 1 is assigned with the ranks the environment already gave them. A worker that
  never asks for a world keeps today's behaviour: the job succeeds when every worker exits 0,
  and any failure before generation 1 was assigned falls back to a full restart (nobody knows
  whether the others would survive it).
* **Forming -> running.** Every member of an assigned generation says it :class:`Entered` the
  world (``with world:``); when all have, the generation is *formed* and the time since the
  failure that caused it is reported. A generation that does not form within
  ``recovery_timeout`` falls back to a full restart, naming who it waited for: a ladder, never a
  hang.
* **A failure.** A member that fails (while forming or running) ends its generation: every
  other assigned member is told, and the next generation is assigned at once. Survivors keep
  their slots and, where it is below the new world size, their rank. A failed slot goes to a
  spare on the same node when there is one (a ready one first, else one still starting), else
  to a new process; fresh members are assigned as soon as they are ready. The spares a node
  lacks are started once the generation formed, never while it forms (they would compete with
  its members starting): a spare that does not exist yet takes no slot, so a second failure
  while forming gets a new process, not a wait for a spare nobody starts.
  Failures while a generation forms simply make the next one (two failures at once: two
  generations in a row, or one, depending on order; never a rank held twice).
* **Membership.** A lost node (its agent died, or the rendezvous lost it) removes its workers
  and makes a smaller generation. A joining node's workers are started and join the *next*
  generation once all of them are ready; the running generation is not disturbed meanwhile.
  A node joining before generation 1 was assigned is simply one of generation 1's; so is a
  node the epoch began with whose agent never started its workers (the round that began it
  ended under that agent in the slot exchange, after the others had read its slot): it joins,
  and only then starts the workers the log's beginning gave it.
* **Verdicts.** A member whose ``with world:`` raised while its world seemed valid asks
  whether the world ended (:class:`Troubled`); its agent reports when it waited long enough
  (:class:`VerdictDue`). If by then most members asked while the others said nothing, the
  silent ones are taken for hung and taken out (:class:`Evict`: on gloo a hung peer gives the
  others no error but their process group's timeout); else, at the final verdict, the error is
  the asker's own (:class:`OwnError`: it fails, as without the API). Every replica of a job
  over many nodes decides alike, from the log's order alone. An early :class:`VerdictDue`
  (``final=False``) only evicts: across nodes the final one waits for a lost node to be known.
* **Leaving.** A survivor told that its world ended must enter the next one; one blocked in a
  collective with a peer that never answers (on a lost node) is made to leave by an abort in
  its own process (see ``aioelastic/worker/_abort.py``). The shell reports a survivor that has
  not entered a later generation in time (:class:`LeaveDue`: it did not leave, or it cannot
  abort); the machine then takes it out like a failed member (:class:`Evict`: the shell kills
  it, a spare or a new process takes its slot).
* **A storm.** More than ``max_failures`` member failures in one attempt fall back too, so a
  failure that every fresh rank meets again ends in the restart budget, not in a loop.
* **The end.** Every member of the running generation exiting 0 finishes the job (spares are
  stopped). A member exiting 0 while another fails, or while a generation forms, falls back.

Who holds state: the members of the last *formed* generation. A member of a new generation that
does not is *fresh*; ``source_rank`` is the lowest rank that is not. Before any generation has
formed nobody holds state, so nobody is fresh. :data:`TRANSITIONS` lists, for each phase, the
events it accepts and the phases they may lead to; anything else is a
:class:`GenerationProtocolError` naming the event and the phase (an entry of an ended world,
a worker entering before anything was assigned). Once finished or fallen back the machine
only takes in what its shell still reports of the processes it stops.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from aioelastic.agent._generation_roster import (
    Roster,
    RosterWorker,
    WorkerState,
    dense_ranks,
    suspects,
)
from aioelastic.agent._generation_types import (
    Assign,
    Command,
    EndWorld,
    Entered,
    Event,
    Evict,
    EvictCause,
    Exited,
    FallBack,
    Finish,
    Generation,
    GenerationAssigned,
    GenerationFormed,
    GenerationProtocolError,
    LeaveDue,
    NodeJoined,
    NodeLost,
    NodeOut,
    NodeSpec,
    OwnError,
    Phase,
    Ready,
    Replacement,
    Spawn,
    Stop,
    Tick,
    TimedOut,
    Troubled,
    VerdictDue,
    WorkerKey,
)

_W, _F, _R = Phase.WAITING, Phase.FORMING, Phase.RUNNING
_DONE, _BACK = Phase.FINISHED, Phase.FELL_BACK
_STOPPING: Mapping[type, frozenset[Phase]] = {
    Exited: frozenset(),
    NodeLost: frozenset(),
    Tick: frozenset(),
    TimedOut: frozenset(),
}
TRANSITIONS: Mapping[Phase, Mapping[type, frozenset[Phase]]] = {
    # Nothing is assigned yet: no world to enter, ask about, leave or time out.
    Phase.WAITING: {
        Ready: frozenset({_W, _F, _BACK}),
        Exited: frozenset({_W, _DONE, _BACK}),
        NodeLost: frozenset({_W, _BACK}),
        NodeJoined: frozenset({_W}),
        Tick: frozenset({_W}),
    },
    Phase.FORMING: {
        Ready: frozenset({_F}),
        Entered: frozenset({_F, _R}),
        Exited: frozenset({_F, _BACK}),
        NodeLost: frozenset({_F, _BACK}),
        NodeJoined: frozenset({_F}),
        Tick: frozenset({_F, _BACK}),
        TimedOut: frozenset({_F, _BACK}),
        LeaveDue: frozenset({_F, _BACK}),
        Troubled: frozenset({_F}),
        VerdictDue: frozenset({_F, _BACK}),
    },
    # Every event of a world can arrive while it runs: the log orders what agents saw, and a
    # report written as a generation formed (a deadline, a leave) is read after it formed.
    Phase.RUNNING: {
        Ready: frozenset({_R, _F}),
        Entered: frozenset({_R}),
        Exited: frozenset({_R, _F, _DONE, _BACK}),
        NodeLost: frozenset({_F, _BACK, _R}),
        NodeJoined: frozenset({_R}),
        Tick: frozenset({_R}),
        TimedOut: frozenset({_R}),
        LeaveDue: frozenset({_R}),
        Troubled: frozenset({_R}),
        VerdictDue: frozenset({_R, _F, _BACK}),
    },
    # Ended: only what the shell still reports of the processes it stops, and a deadline or a
    # loss noted as the end came. Nothing changes any more (an empty set: no handler runs).
    Phase.FINISHED: _STOPPING,
    Phase.FELL_BACK: _STOPPING,
}
"""For each phase, the events it accepts and the phases each may lead to (an empty set: the
event is taken in and changes nothing). An event missing here is a protocol error."""

TERMINAL_PHASES = (Phase.FINISHED, Phase.FELL_BACK)
"""Phases a machine never leaves."""


MAX_FAILURES = 10
"""Member failures one machine (one attempt) replaces in place before it falls back to a
restart: a failure that repeats (a bug every fresh rank meets) must end in the restart budget,
not loop forever."""

_MIXED = (
    "some workers asked for a world (aioelastic.worker) and others exited without asking: "
    "with --recovery in-place, every worker of the job uses aioelastic.worker or none does"
)


@dataclass(slots=True)
class _Recovery:
    """The recovery in progress: when it started, and the deadline of the forming generation."""

    failed_at: float | None
    deadline: float
    replacements: tuple[Replacement, ...] = ()
    entered: set[WorkerKey] = field(default_factory=set)


class GenerationMachine:
    """The generations of one job's world (see the module docstring)."""

    def __init__(
        self,
        nodes: Mapping[int, NodeSpec],
        *,
        recovery_timeout: float,
        first_generation: int = 1,
        max_failures: int = MAX_FAILURES,
    ) -> None:
        if not nodes:
            raise ValueError("a job's world needs at least one node")
        if not recovery_timeout > 0:
            raise ValueError(f"recovery_timeout must be > 0 seconds, got {recovery_timeout!r}")
        if first_generation < 1:
            raise ValueError(f"generations count from 1, got {first_generation!r}")
        self.recovery_timeout = recovery_timeout
        self.first_generation = first_generation
        self.max_failures = max_failures
        self.failures = 0
        """Member failures replaced in place so far."""
        self.phase = Phase.WAITING
        self.generation: Generation | None = None
        self._roster = Roster(nodes)
        self._holds_state: frozenset[WorkerKey] = frozenset()
        self._formed_once = False
        self._recovery: _Recovery | None = None
        self._started = False
        self._first: Counter[WorkerState] = Counter()
        """The first workers' states while WAITING (kept as counts: O(1) per event)."""
        self._done_members = 0
        """Members of the current generation that exited 0."""
        self._troubled: set[WorkerKey] = set()
        """Members of the current generation that asked whether it ended."""
        self._condemned: set[WorkerKey] = set()
        """Members of the current generation told that their error is their own."""
        self.fallback_reason: str | None = None

    # -- queries --------------------------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """When the shell must send :class:`Tick` at the latest (inf: no deadline)."""
        return self._recovery.deadline if self._recovery is not None else math.inf

    @property
    def nodes(self) -> tuple[int, ...]:
        """The nodes in the job (admitted or joining), in order."""
        return tuple(self._roster.nodes)

    def state_of(self, key: WorkerKey) -> WorkerState:
        return self._roster[key].state

    def spares(self, node: int | None = None) -> tuple[WorkerKey, ...]:
        """Ready spares (on ``node``, or anywhere), oldest first."""
        return self._roster.spares(node)

    def holders(self, node: int) -> dict[int, WorkerKey]:
        """Who holds each slot (local rank) of ``node`` now: the current generation's members
        there, else the workers started for a slot. A spare that never took a slot holds none;
        a replaced worker no longer holds its slot."""
        generation = self.generation
        if generation is not None:
            return {
                generation.slots[rank]: key
                for rank, key in enumerate(generation.members)
                if key.node == node
            }
        return {w.slot: w.key for w in self._roster if w.slot is not None and w.key.node == node}

    def alive(self) -> tuple[WorkerKey, ...]:
        """Every worker that still runs, as far as the machine knows."""
        return self._roster.alive()

    # -- driving ----------------------------------------------------------------------------------

    def start(self, now: float) -> list[Command]:
        """The first workers of every node (slot order) and the spares."""
        if self._started:
            raise RuntimeError("start() runs once")
        self._started = True
        commands: list[Command] = []
        for node in self._roster.nodes:
            commands += self._spawn_node(node, joiner=False)
        self._first[WorkerState.STARTING] = sum(1 for w in self._roster if w.slot is not None)
        return commands

    def send(self, event: Event, now: float) -> list[Command]:
        """Feed one event; return what the shell must do, in order."""
        allowed = TRANSITIONS[self.phase].get(type(event))
        if allowed is None:
            raise GenerationProtocolError(event, self.phase, "not accepted here")
        if not allowed:
            return []  # taken in: it changes nothing
        before = self.phase
        commands = self._handle(event, now)
        if self.phase not in allowed:
            raise AssertionError(f"{type(event).__name__} moved {before.name} to {self.phase.name}")
        return commands

    # -- handlers ---------------------------------------------------------------------------------

    def _handle(self, event: Event, now: float) -> list[Command]:
        match event:
            case Ready():
                return self._ready(self._known(event, event.worker), now)
            case Entered():
                return self._entered(self._known(event, event.worker), event.generation, now)
            case Exited():
                return self._exited(self._known(event, event.worker), event.returncode, now)
            case NodeLost():
                return self._node_lost(event.node, now, left=event.left)
            case NodeJoined():
                return self._node_joined(event, now)
            case Tick():
                if now >= self.deadline:
                    return self._fall_back(self._why_not_formed())
                return []
            case LeaveDue():
                return self._leave_due(self._known(event, event.worker), event, now)
            case Troubled():
                worker = self._known(event, event.worker)
                if self._asks_of_current(worker, event.generation):
                    self._troubled.add(worker.key)
                return []
            case VerdictDue():
                return self._verdict(self._known(event, event.worker), event, now)
            case TimedOut(generation=number):
                current = self.generation
                if self.phase is Phase.FORMING and current is not None and current.number == number:
                    return self._fall_back(self._why_not_formed())
                return []  # that generation formed or ended meanwhile
        raise AssertionError(event)  # pragma: no cover

    def _known(self, event: Event, key: WorkerKey) -> RosterWorker:
        worker = self._roster.get(key)
        if worker is None:
            raise GenerationProtocolError(event, self.phase, f"worker {key} was never started")
        return worker

    def _ready(self, worker: RosterWorker, now: float) -> list[Command]:
        if worker.state is not WorkerState.STARTING:
            return []  # a worker asks once per process; a repeat (or a late one) changes nothing
        worker.state = WorkerState.READY
        generation = self.generation
        if self.phase is Phase.WAITING:
            if worker.slot is None:
                return []
            self._first[WorkerState.STARTING] -= 1
            self._first[WorkerState.READY] += 1
            if self._first[WorkerState.DONE]:
                return self._fall_back(_MIXED)
            if not self._first[WorkerState.STARTING]:
                return self._assign(now, "the job started", failed_at=None, first=True)
            return []
        if generation is not None and worker.key in generation:
            worker.state = WorkerState.MEMBER  # a replacement that was started for its place
            return [Assign(worker.key, generation.place_of(worker.key))]
        if worker.joiner:
            node = worker.key.node
            ready = all(
                w.state is WorkerState.READY
                for w in self._roster
                if w.key.node == node and w.joiner and w.slot is not None
            )
            if ready and self.phase is Phase.RUNNING and not self._finishing():
                return self._next_generation(now, f"node {node} joined", failed_at=None)
        return []

    def _entered(self, worker: RosterWorker, number: int, now: float) -> list[Command]:
        generation, recovery = self.generation, self._recovery
        if generation is None or number != generation.number or recovery is None:
            return []  # a generation that already ended, or a repeat
        if worker.key not in generation:
            return []
        worker.entered = max(worker.entered, number)
        recovery.entered.add(worker.key)
        if self.phase is Phase.FORMING and len(recovery.entered) == generation.world_size:
            self.phase = Phase.RUNNING
            self._recovery = None
            self._formed_once = True
            self._holds_state = frozenset(generation.members)
            since = None if recovery.failed_at is None else now - recovery.failed_at
            commands: list[Command] = [GenerationFormed(generation, recovery.replacements, since)]
            for node in self._roster.nodes:  # a joining node's too, as it was while forming
                commands += self._replenish(node)
            return commands + self._admit_ready_joiners(now)
        return []

    def _exited(self, worker: RosterWorker, returncode: int, now: float) -> list[Command]:
        was = worker.state
        if was in (WorkerState.DONE, WorkerState.GONE):
            return []
        worker.state = WorkerState.DONE if returncode == 0 else WorkerState.GONE
        generation = self.generation
        member = generation is not None and worker.key in generation
        if self.phase is Phase.WAITING:
            if worker.slot is None:  # a spare died: start another
                return self._replenish(worker.key.node)
            if returncode != 0:
                return self._fall_back(
                    f"worker {worker.key} (local rank {worker.slot}) failed (status "
                    f"{returncode}) before every worker asked for a world"
                )
            self._first[was] -= 1
            self._first[WorkerState.DONE] += 1
            if self._first[WorkerState.READY]:
                return self._fall_back(_MIXED)
            if not self._first[WorkerState.STARTING]:
                return self._finish()
            return []
        if not member:
            if worker.slot is None:
                return self._replenish(worker.key.node)
            if worker.joiner:  # a joining node's worker died before it was admitted
                return self._fall_back(
                    f"worker {worker.key} of joining node {worker.key.node} failed"
                )
            return []
        assert generation is not None
        rank = generation.rank_of(worker.key)
        if returncode == 0:
            if self.phase is Phase.FORMING:
                return self._fall_back(
                    f"rank {rank} exited 0 while generation {generation.number} formed: its "
                    "world ended under it and it left worker.worlds() instead of joining the "
                    "next one (a `break` after `with world:`? put it inside the block, after "
                    "training returns)"
                )
            self._done_members += 1
            if self._done_members == generation.world_size:
                return self._finish()
            return []
        if self._finishing():
            return self._fall_back(
                f"rank {rank} failed (status {returncode}) after other ranks had finished"
            )
        self.failures += 1
        if self.failures > self.max_failures:
            return self._fall_back(
                f"rank {rank} failed (status {returncode}): {self.failures} failures in place "
                f"exceed the {self.max_failures} one attempt may replace (a failure storm)"
            )
        why = f"rank {rank} (worker {worker.key}) failed (status {returncode})"
        return self._member_gone(now, why)

    def _member_gone(self, now: float, why: str) -> list[Command]:
        """A member failed or was taken out: the next generation, its survivors' collectives
        aborted (a collective with the gone member never completes)."""
        failed_at = self._recovery.failed_at if self._recovery is not None else None
        failed_at = now if failed_at is None else failed_at
        return self._next_generation(now, why, failed_at=failed_at, abort=True)

    def _asks_of_current(self, worker: RosterWorker, number: int) -> bool:
        generation = self.generation
        return (
            generation is not None
            and generation.number == number
            and worker.key in generation
            and worker.state is WorkerState.MEMBER
        )

    def condemned_alive(self, key: WorkerKey) -> bool:
        """Whether a member other than ``key`` was told its error is its own and still runs
        (its exit breaks the others' collectives before its agent sees it: wait for it)."""
        return any(
            k != key and self._roster[k].state is WorkerState.MEMBER for k in self._condemned
        )

    def _verdict(self, worker: RosterWorker, event: VerdictDue, now: float) -> list[Command]:
        """Evict the likely hung peers, or (final) tell the asker its error is its own."""
        generation = self.generation
        if not self._asks_of_current(worker, event.generation) or worker.key in self._condemned:
            return []  # the world ended meanwhile (the end answered it), or a repeat
        assert generation is not None
        alive = [
            k
            for k in generation.members
            if self._roster[k].state is WorkerState.MEMBER and k not in self._condemned
        ]
        asked = {k for k in alive if k in self._troubled}
        hung = suspects(alive, asked)
        if hung:
            commands: list[Command] = []
            for key in hung:
                self._roster[key].state = WorkerState.GONE
                self.failures += 1
                reason = (
                    f"{len(asked)} of {len(alive)} ranks' collectives failed in generation "
                    f"{generation.number} while it answered nothing: {EvictCause.HUNG.value}"
                )
                commands.append(Evict(key, generation.number, EvictCause.HUNG, reason))
            ranks = ", ".join(str(generation.rank_of(k)) for k in hung)
            why = f"rank(s) {ranks} taken for hung"
            if self.failures > self.max_failures:
                return commands + self._fall_back(f"{why}: {self.failures} failures (a storm)")
            return commands + self._member_gone(now, why)
        if not event.final:
            return []
        self._condemned.add(worker.key)
        return [OwnError(worker.key, generation.number)]

    def _leave_due(self, worker: RosterWorker, event: LeaveDue, now: float) -> list[Command]:
        """Take out a survivor that was told ``event.generation`` ended and entered no later
        one since (it is stuck in that world): like a failed member, but it still runs."""
        generation = self.generation
        if (
            generation is None
            or self.phase is not Phase.FORMING
            or worker.key not in generation
            or worker.state is not WorkerState.MEMBER
            or worker.entered > event.generation
            or generation.number <= event.generation
        ):
            return []  # it left (or died, or the job moved on): nothing to do
        if self._finishing():
            return []  # pragma: no cover - a forming generation has no finished member
        worker.state = WorkerState.GONE
        self.failures += 1
        rank = generation.rank_of(worker.key)
        detail = f": {event.detail}" if event.detail else ""
        why = (
            f"rank {rank} (worker {worker.key}) was taken out: {event.cause.value} "
            f"from generation {event.generation}{detail}"
        )
        evict = Evict(worker.key, event.generation, event.cause, why)
        if self.failures > self.max_failures:
            return [evict, *self._fall_back(f"{why}: {self.failures} failures in place (a storm)")]
        return [evict, *self._member_gone(now, why)]

    def _node_lost(self, node: int, now: float, *, left: bool = False) -> list[Command]:
        if self._roster.remove_node(node) is None:
            return []  # a node never in the job (a joining agent says so before it joins)
        how = "left" if left else "was lost"
        # Its agent may live on (lost for a round it missed): its workers' places are given
        # away, so it stops them. One that left said so itself, and is stopping already.
        out: list[Command] = [] if left else [NodeOut(node, f"node {node} {how}")]
        if self.phase is Phase.WAITING:
            return out + self._fall_back(f"node {node} was lost before generation 1 was assigned")
        generation = self.generation
        if generation is None or all(k.node != node for k in generation.members):
            return out  # a joining node that was never admitted
        if self._finishing():
            return out + self._fall_back(f"node {node} was lost after other ranks had finished")
        return out + self._member_gone(now, f"node {node} {how}")

    def _node_joined(self, event: NodeJoined, now: float) -> list[Command]:
        waiting = self.phase is Phase.WAITING  # before generation 1: the node is one of its own
        if event.node in self._roster.nodes:
            unstarted = self._roster.unstarted(event.node, event.spec) if waiting else None
            if unstarted is None:
                why = f"node {event.node} is already in the job"
                raise GenerationProtocolError(event, self.phase, why)
            return [Spawn(w.key, w.slot) for w in unstarted]  # it missed the epoch's beginning
        self._roster.add_node(event.node, event.spec, in_world=waiting)
        if waiting:
            self._first[WorkerState.STARTING] += event.spec.local_world_size
        return self._spawn_node(event.node, joiner=not waiting)

    # -- making generations ---------------------------------------------------------------------

    def _next_generation(
        self, now: float, reason: str, *, failed_at: float | None, abort: bool = False
    ) -> list[Command]:
        generation = self.generation
        assert generation is not None
        ended = tuple(k for k in generation.members if self._roster[k].state is WorkerState.MEMBER)
        commands: list[Command] = (
            [EndWorld(generation.number, ended, reason, abort)] if ended else []
        )
        for key in ended:
            self._roster[key].state = WorkerState.READY
        return commands + self._assign(now, reason, failed_at=failed_at, first=False)

    def _assign(
        self, now: float, reason: str, *, failed_at: float | None, first: bool
    ) -> list[Command]:
        previous = self.generation
        commands: list[Command] = []
        holders: dict[tuple[int, int], RosterWorker] = {}  # (node, slot) -> worker
        for worker in self._roster:
            if worker.slot is not None and worker.state in (
                WorkerState.READY,
                WorkerState.STARTING,
            ):
                if worker.joiner and not self._roster.joiners_ready(worker.key.node):
                    continue
                if worker.state is WorkerState.STARTING and first:
                    continue
                holders.setdefault((worker.key.node, worker.slot), worker)
        replacements: list[tuple[tuple[int, int], RosterWorker, WorkerKey | None, bool]] = []
        old_holder: dict[tuple[int, int], WorkerKey] = {}
        if previous is not None:
            for key, slot in zip(previous.members, previous.slots, strict=True):
                old_holder[(key.node, slot)] = key
        for node, state in self._roster.nodes.items():
            if not state.in_world and not self._roster.joiners_ready(node):
                continue
            state.in_world = True
            for slot in range(state.spec.local_world_size):
                if (node, slot) in holders:
                    continue
                spare = self._roster.spare_for(node)
                if spare is not None:
                    worker = self._roster[spare]
                    worker.slot = slot
                    by_spare = True
                else:
                    worker = self._roster.new_worker(node, slot)
                    commands.append(Spawn(worker.key, slot))
                    by_spare = False
                holders[(node, slot)] = worker
                replacements.append(((node, slot), worker, old_holder.get((node, slot)), by_spare))
        if not holders:
            return self._fall_back(f"{reason}: no node is left to form a world")
        members = dense_ranks(holders, previous)
        for worker in members:
            worker.joiner = False
        fresh = frozenset(
            w.key for w in members if self._formed_once and w.key not in self._holds_state
        )
        number = self.first_generation if previous is None else previous.number + 1
        generation = Generation(
            number,
            tuple(w.key for w in members),
            tuple(w.slot for w in members if w.slot is not None),
            fresh,
            reason,
        )
        self.generation = generation
        self._done_members = 0
        self._troubled, self._condemned = set(), set()
        self.phase = Phase.FORMING
        rank_of = {w.key: r for r, w in enumerate(members)}
        done = tuple(
            Replacement(rank_of[w.key], key[0], key[1], old, w.key, spare)
            for key, w, old, spare in replacements
        )
        self._recovery = _Recovery(failed_at, now + self.recovery_timeout, done)
        commands.append(GenerationAssigned(generation, done))
        for worker in members:
            if worker.state is WorkerState.READY:
                worker.state = WorkerState.MEMBER
                commands.append(Assign(worker.key, generation.place_of(worker.key)))
        return commands

    def _finishing(self) -> bool:
        """Whether a member of the current generation already exited 0 (the job is ending)."""
        return self._done_members > 0

    def _admit_ready_joiners(self, now: float) -> list[Command]:
        if self._finishing():
            return []
        for node, state in self._roster.nodes.items():
            if not state.in_world and self._roster.joiners_ready(node):
                return self._next_generation(now, f"node {node} joined", failed_at=None)
        return []

    # -- helpers --------------------------------------------------------------------------------

    def _spawn_node(self, node: int, *, joiner: bool) -> list[Command]:
        return [Spawn(w.key, w.slot) for w in self._roster.node_workers(node, joiner=joiner)]

    def _replenish(self, node: int) -> list[Command]:
        """Start spares until ``node`` has as many (ready or starting) as it should; none while
        a generation forms (its formation starts them)."""
        if self.phase in TERMINAL_PHASES or self.phase is Phase.FORMING:
            return []
        missing = self._roster.spares_missing(node)
        return [Spawn(self._roster.new_worker(node, None).key, None) for _ in range(missing)]

    def _finish(self) -> list[Command]:
        self.phase = Phase.FINISHED
        self._recovery = None
        commands: list[Command] = [Stop(key) for key in self.alive()]
        return [*commands, Finish()]

    def _fall_back(self, reason: str) -> list[Command]:
        self.phase = Phase.FELL_BACK
        self._recovery = None
        self.fallback_reason = reason
        return [FallBack(reason)]

    def _why_not_formed(self) -> str:
        generation, recovery = self.generation, self._recovery
        assert generation is not None
        assert recovery is not None
        missing = []
        for rank, key in enumerate(generation.members):
            if key in recovery.entered:
                continue
            state = self._roster[key].state
            doing = (
                "never asked for a world" if state is WorkerState.STARTING else "did not enter it"
            )
            missing.append(f"rank {rank} (worker {key}) {doing}")
        return (
            f"generation {generation.number} did not form within {self.recovery_timeout:g} s: "
            + "; ".join(missing)
        )
