"""Generations of a job's world: the in-place recovery protocol, one pure core and thin shells.

Where things are. This module is the core's face: it re-exports the protocol's names, so
``from aioelastic.agent import _generations as g`` reads ``g.Spawn``, ``g.GenerationMachine``.
Everything below ``agent/`` named ``_generation_*`` or ``_replica`` is pure: no I/O, no clock,
``now`` passed in.

* ``_generation_machine.py``: the protocol itself, :class:`GenerationMachine` and its table
  (:data:`TRANSITIONS`, the spec: an event a phase does not list is a
  :class:`GenerationProtocolError`), with the theory of operation. Every rule about who holds
  which rank in which generation is there.
* ``_generation_types.py``: its words (workers, generations, events in, commands out);
  ``_generation_roster.py``: its bookkeeping of processes and slots, and two choices made over
  them (dense ranks, the suspects of a hang).
* ``_generation_log.py``: the replicated log that carries events between agents, and the epochs
  that give each log its life (which node begins, stays in, joins or leaves one).
* ``_replica.py``: one agent's replica of the job's world, the machine fed in the log's order
  plus every rule the agents add (verdict and leave timers, a deadline once per generation, a
  joining node's replay, which commands concern this node and in what order).

The shells only do I/O. ``_recovery.py`` (:class:`InPlaceGroup`, one class for one node and for
many) hears the workers (``_worker_links.py``: processes, links, abort sockets), hands what it
saw to the replica and does what the replica says. The log it appends to is its transport
(``_generation_store.py``): the agent's own memory on one node, the job's store across nodes,
which also hold the generations' stores. ``_attempts.py`` picks each attempt's group. The test
kit's ``WorldSimulation`` drives the same replicas over a simulated log, so what the tests prove
is what the agent runs.
"""

from __future__ import annotations

from aioelastic.agent._generation_log import (
    INPLACE_RECORD_PREFIX,
    Begin,
    EpochPlan,
    GenerationLogError,
    LogEntry,
    NodeRecord,
    decode_entry,
    encode_entry,
    plan_epoch,
)
from aioelastic.agent._generation_machine import (
    MAX_FAILURES,
    TERMINAL_PHASES,
    TRANSITIONS,
    GenerationMachine,
)
from aioelastic.agent._generation_roster import WorkerState, suspects
from aioelastic.agent._generation_types import (
    GENERATION_PREFIX,
    LEAVE_CAUSES,
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
    Place,
    Ready,
    Replacement,
    Spawn,
    Stop,
    Tick,
    TimedOut,
    Troubled,
    VerdictDue,
    WorkerKey,
    generation_key,
)

__all__ = [
    "GENERATION_PREFIX",
    "INPLACE_RECORD_PREFIX",
    "LEAVE_CAUSES",
    "MAX_FAILURES",
    "TERMINAL_PHASES",
    "TRANSITIONS",
    "Assign",
    "Begin",
    "Command",
    "EndWorld",
    "Entered",
    "EpochPlan",
    "Event",
    "Evict",
    "EvictCause",
    "Exited",
    "FallBack",
    "Finish",
    "Generation",
    "GenerationAssigned",
    "GenerationFormed",
    "GenerationLogError",
    "GenerationMachine",
    "GenerationProtocolError",
    "LeaveDue",
    "LogEntry",
    "NodeJoined",
    "NodeLost",
    "NodeOut",
    "NodeRecord",
    "NodeSpec",
    "OwnError",
    "Phase",
    "Place",
    "Ready",
    "Replacement",
    "Spawn",
    "Stop",
    "Tick",
    "TimedOut",
    "Troubled",
    "VerdictDue",
    "WorkerKey",
    "WorkerState",
    "decode_entry",
    "encode_entry",
    "generation_key",
    "plan_epoch",
    "suspects",
]
