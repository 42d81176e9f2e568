"""Generations of a job's world: the in-place recovery protocol as a pure state machine.

Where things are. In-place recovery is one pure core and thin shells that do its I/O. This
module is the protocol: :class:`GenerationMachine` and its table (:data:`TRANSITIONS`), every
rule about who holds which rank in which generation. Its words are in ``_generation_types.py``
(workers, events in, commands out), its bookkeeping of processes in ``_generation_roster.py``,
and the replicated log that carries its events between agents, with the epochs that give each
log its life, in ``_generation_log.py``. ``_replica.py`` is one agent's replica of the job's
world: the machine fed in the log's order plus the agent's own timers (verdicts, leaving,
deadlines), the replay of a joining node and which commands concern this node; it is pure too,
and holds every rule the shells used to. The shells only do I/O: ``_recovery.py`` runs the
workers (processes and their links, ``_worker_links.py``) and feeds the replica; the log it
appends to is this agent's memory on one node, or the job's store across nodes
(``_generation_store.py``): one machine either way, two transports. ``_attempts.py`` picks the
group of each attempt. ``aioelastic.testing.WorldSimulation`` drives the same replicas over a
simulated log, so what the tests prove is what the agent runs.
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
