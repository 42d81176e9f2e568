"""One agent's replica of a job's world: the generation machine, fed in the log's order, and the
agent's own timers. Pure: no I/O, no clock (every call takes ``now``).

Every agent runs one :class:`Replica` per attempt under ``--recovery in-place``, on one node as
across many. What the agent sees of its own workers (a hello, an entry into a world, a question,
an exit, an answer to an abort) goes in through the ``saw_...`` methods, which say what to append
to the log; what the log says comes back, in the log's order, through :meth:`Replica.feed`, which
says what this node must do. On one node the log is the agent's memory and an entry is fed the
moment it is made; across nodes it is the job's store, and every replica is fed the same entries
in the same order, so they all decide alike (``_generation_machine.py``).

The rules that are not the machine's but every agent's:

* **Verdicts.** A worker whose ``with world:`` raised asks whether its world ended. The replica
  waits ``verdict_grace`` for the end (a peer's death on this node reaches the agent through
  its pidfd within milliseconds; across nodes only once its agent or the rendezvous says so, so
  there an early look for hung peers comes first, after :data:`VERDICT_GRACE`), then logs
  :class:`~._generation_types.VerdictDue`. A final verdict waits on while a peer told "still
  valid" is failing (its exit breaks the others' collectives before the agent sees it), up to
  ``recovery_timeout`` since the asking.
* **Leaving.** A survivor told that its world ended has ``recovery_timeout / 2`` to enter the
  next (sooner when it cannot abort, ``_leaving.py``); then a
  :class:`~._generation_types.LeaveDue` is logged.
* **Deadlines.** A generation that does not form by the machine's deadline is logged as
  :class:`~._generation_types.TimedOut`, once per generation.
* **Replay.** A node joining a running epoch replays its log from the start; the workers the
  log names are gone, and until its own arrival (``NodeJoined`` written by this agent) is read
  back it acts on nothing but the epoch's end. A node the epoch began with that never ran it
  (the round ended under it in the slot exchange: the nodes of one round may disagree on
  whether it began) has no earlier life to call lost: it only joins.
* **This node.** Only the commands about this node's workers concern it; it tells workers
  first, then starts processes, then reports; a new spare waits until the world formed
  (starting a process holds the agent's loop, which also serves the world's store).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from aioelastic.agent._generation_log import Begin, LogEntry
from aioelastic.agent._generation_machine import GenerationMachine
from aioelastic.agent._generation_types import (
    Assign,
    Command,
    EndWorld,
    Entered,
    Event,
    Evict,
    Exited,
    FallBack,
    Finish,
    NodeJoined,
    NodeLost,
    NodeOut,
    NodeSpec,
    OwnError,
    Phase,
    Ready,
    Spawn,
    Stop,
    TimedOut,
    Troubled,
    VerdictDue,
    WorkerKey,
)
from aioelastic.agent._leaving import LeaveDeadlines

VERDICT_GRACE = 2.0
"""How long a worker whose ``with world:`` raised waits to hear that its world ended before the
exception counts as its own (a peer's death reaches the agent through its pidfd within
milliseconds; a collective's error can come first)."""

CANNOT_ABORT_GRACE = 2.0
"""How long a survivor that cannot abort its collectives (its backend has no abort) is given
to leave its ended world by itself (it may not be in a collective) before it is restarted."""

_TOLD = Assign | EndWorld | Stop | Evict | OwnError
"""Commands that tell a worker something: done before anything slower."""


@dataclass(slots=True)
class _Verdict:
    """A troubled worker waiting for its world's verdict: when it is due, whether it is the
    final one (else an early look for hung peers), when the worker asked."""

    generation: int
    due: float
    final: bool
    asked_at: float


class Replica:
    """This agent's replica of the job's world (see the module docstring).

    ``replicated``: the log is shared with other agents (a job over many nodes), so a peer's
    death elsewhere is known late, and an entry every replica refuses is skipped, not an error.
    ``token`` names this agent's entries in that log. ``leave_timeout``: a survivor's time to
    enter its next world (default: half of ``recovery_timeout``, its collectives' timeout).
    """

    def __init__(
        self,
        node: int,
        *,
        recovery_timeout: float,
        replicated: bool = False,
        token: str = "",
        leave_timeout: float | None = None,
    ) -> None:
        self.node = node
        self.recovery_timeout = recovery_timeout
        self.replicated = replicated
        self.token = token
        self.machine: GenerationMachine | None = None
        """None until the replica began or joined an epoch."""
        self.replaying = False
        """Joining: reading the log up to its own arrival, acting on nothing but the end."""
        self.decided: list[Command] = []
        """Everything the machine said about the last entry fed (every node's commands)."""
        self._verdicts: dict[WorkerKey, _Verdict] = {}
        leave = recovery_timeout / 2 if leave_timeout is None else leave_timeout
        self._leaving = LeaveDeadlines(leave, CANNOT_ABORT_GRACE)
        self._timed_out: set[int] = set()

    @property
    def verdict_grace(self) -> float:
        """How long a troubled worker waits for its world's end before its error counts as its
        own (across nodes: until a peer's death elsewhere is surely known)."""
        return self.recovery_timeout if self.replicated else VERDICT_GRACE

    @property
    def live(self) -> bool:
        """Whether the replica runs an epoch still (began or joined, not ended)."""
        machine = self.machine
        return machine is not None and machine.phase not in (Phase.FINISHED, Phase.FELL_BACK)

    @property
    def ended(self) -> bool:
        """Whether the replica's epoch finished or fell back."""
        machine = self.machine
        return machine is not None and machine.phase in (Phase.FINISHED, Phase.FELL_BACK)

    @property
    def last_generation(self) -> int:
        """The newest generation number this replica has seen (0: none)."""
        machine = self.machine
        return 0 if machine is None or machine.generation is None else machine.generation.number

    def _machine(self) -> GenerationMachine:
        if self.machine is None:
            raise RuntimeError("the replica has not begun or joined an epoch yet")
        return self.machine

    # -- beginning ------------------------------------------------------------------------------

    def begin(self, begin: Begin, now: float) -> list[Command]:
        """Begin the epoch ``begin`` says: this node's first workers and spares to start."""
        self.machine = self._new_machine(begin.nodes, begin.first_generation)
        self.decided = self.machine.start(now)
        return self._mine(self.decided, now)

    def join(self, begin: Begin, spec: NodeSpec, now: float, *, ran_it: bool = True) -> list[Event]:
        """Join a running epoch whose log began with ``begin``: replay it (the workers it names
        are gone); what to log: this node's earlier life is lost, and it joins with ``spec``.

        ``ran_it``: whether this agent ran the epoch before. A node the epoch began with whose
        agent never did (the round that began it ended under this agent in its slot exchange,
        after the others had read its slot) had no earlier life there: it only joins, one of
        generation 1's (``_generation_machine.py``, Membership)."""
        self.machine = self._new_machine(begin.nodes, begin.first_generation)
        self.machine.start(now)
        self.replaying = True
        if self.node in begin.nodes and not ran_it:
            return [NodeJoined(self.node, spec)]
        return [NodeLost(self.node), NodeJoined(self.node, spec)]

    def _new_machine(self, nodes: Mapping[int, NodeSpec], first: int) -> GenerationMachine:
        return GenerationMachine(
            nodes, recovery_timeout=self.recovery_timeout, first_generation=first
        )

    # -- what this agent saw: the events to log -------------------------------------------------

    def saw_hello(self, key: WorkerKey) -> Event:
        return Ready(key)

    def saw_enter(self, key: WorkerKey, generation: int) -> Event:
        self._leaving.entered(key, generation)
        return Entered(key, generation)

    def saw_exit(self, key: WorkerKey, returncode: int) -> Event:
        self._leaving.forget(key)
        self._verdicts.pop(key, None)
        return Exited(key, returncode)

    def saw_trouble(self, key: WorkerKey, generation: int, now: float) -> list[Event]:
        """``key`` asks whether ``generation`` ended; nothing to log for an ended world (the
        end answers it)."""
        current = self._machine().generation
        if current is None or current.number != generation:
            return []
        early = self.verdict_grace > VERDICT_GRACE  # a first look for hung peers
        grace = VERDICT_GRACE if early else self.verdict_grace
        self._verdicts[key] = _Verdict(generation, now + grace, not early, now)
        return [Troubled(key, generation)]

    def saw_cannot_abort(self, key: WorkerKey, generation: int, detail: str, now: float) -> None:
        """``key`` answered that it cannot abort ``generation``'s collectives."""
        self._leaving.cannot_abort(key, generation, detail, now)

    def saw_node_lost(self, node: int) -> list[Event]:
        """The rendezvous says ``node`` is gone (its heartbeat stopped): log it, unless this
        replica is still replaying (it acts on nothing yet) or its epoch ended."""
        return [] if self.replaying or self.ended else [NodeLost(node)]

    def saw_round(self, members: Collection[int]) -> list[Event]:
        """A later rendezvous round of ``members`` completed: the epoch's nodes not among
        them are lost."""
        machine = self.machine
        if machine is None or self.replaying:
            return []
        return [NodeLost(node) for node in machine.nodes if node not in members]

    def saw_leaving(self) -> Event | None:
        """This node stops (a signal): what to log at once, so that the others make their
        smaller world now rather than after a heartbeat timeout (None: nothing to say)."""
        if self.replaying or self.ended:
            return None
        return NodeLost(self.node, left=True)

    # -- time -------------------------------------------------------------------------------------

    def next_due(self) -> float:
        """When :meth:`due` has something to say at the earliest (inf: nothing pending)."""
        return min(
            self._deadline(),
            *(verdict.due for verdict in self._verdicts.values()),
            self._leaving.next_due(),
        )

    def _deadline(self) -> float:
        machine = self.machine
        if machine is None or self.replaying or machine.generation is None:
            return math.inf
        if machine.generation.number in self._timed_out:
            return math.inf
        return machine.deadline

    def due(self, now: float) -> list[Event]:
        """What to log now that it is ``now``: verdicts, survivors due to have left, a
        generation that did not form in time."""
        events = self._verdicts_due(now)
        events += self._leaving.due(now)
        machine = self.machine
        if machine is not None and machine.generation is not None and now >= self._deadline():
            self._timed_out.add(machine.generation.number)
            events.append(TimedOut(machine.generation.number))
        return events

    def _verdicts_due(self, now: float) -> list[Event]:
        events: list[Event] = []
        for key, verdict in list(self._verdicts.items()):
            if verdict.due > now or self._verdicts.get(key) is not verdict:
                continue
            del self._verdicts[key]
            number = verdict.generation
            if not verdict.final:
                due = verdict.asked_at + self.verdict_grace
                self._verdicts[key] = _Verdict(number, due, True, verdict.asked_at)
            elif (
                self._machine().condemned_alive(key)
                and now - verdict.asked_at < self.recovery_timeout
            ):
                self._verdicts[key] = _Verdict(number, now + VERDICT_GRACE, True, verdict.asked_at)
                continue
            events.append(VerdictDue(key, number, verdict.final))
        return events

    # -- the log: what this node does -------------------------------------------------------------

    def feed(self, entry: LogEntry, now: float) -> list[Command]:
        """Feed the log's next entry; return what this node does, in order.

        A :class:`~._generation_types.GenerationProtocolError` propagates: across nodes the
        shell skips the entry, as every replica does."""
        event = entry.event
        if isinstance(event, Begin):
            return []
        self.decided = []
        self.decided = commands = self._machine().send(event, now)
        if self.replaying:
            if entry.by == self.token and isinstance(event, NodeJoined):
                self.replaying = False  # caught up: from here on this replica acts
            else:  # the epoch may end before this node got in: end with it
                return [c for c in commands if isinstance(c, FallBack | Finish)]
        return self._mine(commands, now)

    def _mine(self, commands: list[Command], now: float) -> list[Command]:
        """This node's share of ``commands``, in the order to do them, its timers updated."""
        ours = [c for c in commands if self._concerns_me(c)]
        ordered = [
            *(c for c in ours if isinstance(c, _TOLD)),
            *(c for c in ours if isinstance(c, Spawn)),
            *(c for c in ours if not isinstance(c, _TOLD | Spawn)),
        ]
        done: list[Command] = []
        for command in ordered:
            match command:
                case EndWorld(workers=workers, generation=number):
                    here = tuple(k for k in workers if k.node == self.node)
                    for key in here:
                        self._verdicts.pop(key, None)
                        self._leaving.ended(key, number, now)
                    if not here:
                        continue
                    command = replace(command, workers=here)
                case Evict(worker=key):
                    self._leaving.forget(key)
            done.append(command)
        return done

    def _concerns_me(self, command: Command) -> bool:
        """Whether this node acts on ``command`` (each node starts and tells only its own)."""
        if isinstance(command, Spawn | Assign | Stop | Evict | OwnError):
            return command.worker.node == self.node
        if isinstance(command, NodeOut):
            return command.node == self.node
        return True
