"""The replicated generation log, and the epochs that give each log its life.

Pure: records and their bytes, and the decision every node of a round makes alike. The shell
that appends to and follows a log in the job's store is ``_generation_store.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aioelastic.agent._generation_types import (
    Entered,
    Event,
    EvictCause,
    Exited,
    LeaveDue,
    NodeJoined,
    NodeLost,
    NodeSpec,
    Ready,
    Tick,
    TimedOut,
    Troubled,
    VerdictDue,
    WorkerKey,
)

# -- the replicated log ------------------------------------------------------------------------
# Across nodes, every agent runs its own replica of the job's machine. The replicas agree because
# they are fed the same events in the same order: a log in the job's store, each entry appended by
# the agent that saw it happen (a worker of its node asked, entered or exited; a node was lost or
# joined; a deadline passed). The machine is deterministic given that order; ``now`` only feeds
# reports (each replica's own clock), and deadlines enter the log as :class:`TimedOut`.


@dataclass(frozen=True, slots=True)
class Begin:
    """The first entry of a job's log: the nodes its machine starts with."""

    nodes: Mapping[int, NodeSpec]
    first_generation: int


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of a job's generation log."""

    event: Event | Begin
    by: str = ""
    """The agent that appended it (a token unique to that agent); empty for :class:`Begin`,
    which every agent writes alike."""
    serial: int = 0
    """The appender's own count: no two entries are the same bytes."""
    pid: int | None = None
    """With :class:`Ready`: the worker's process id (for reports on every node)."""


class GenerationLogError(ValueError):
    """A generation log entry could not be decoded (the message names the bytes)."""

    def __init__(self, raw: bytes, why: str) -> None:
        super().__init__(f"bad generation log entry {raw[:200]!r}: {why}")


def encode_entry(entry: LogEntry) -> bytes:
    """The bytes of ``entry`` (equal entries give equal bytes)."""
    event = entry.event
    body: object
    match event:
        case Begin():
            nodes = sorted(event.nodes.items())
            body = {
                "begin": [[n, x.local_world_size, x.spares] for n, x in nodes],
                "first": event.first_generation,
            }
        case Ready(worker=w):
            body = {"ready": [w.node, w.serial]}
        case Entered(worker=w, generation=number):
            body = {"entered": [w.node, w.serial, number]}
        case Exited(worker=w, returncode=code):
            body = {"exited": [w.node, w.serial, code]}
        case NodeLost(node=node, left=left):
            body = {"left": node} if left else {"lost": node}
        case NodeJoined(node=node, spec=spec):
            body = {"joined": [node, spec.local_world_size, spec.spares]}
        case TimedOut(generation=number):
            body = {"timeout": number}
        case LeaveDue(worker=w, generation=number, cause=cause, detail=detail):
            body = {"leave": [w.node, w.serial, number, cause.value, detail]}
        case Troubled(worker=w, generation=number):
            body = {"troubled": [w.node, w.serial, number]}
        case VerdictDue(worker=w, generation=number, final=final):
            body = {"verdict": [w.node, w.serial, number, bool(final)]}
        case Tick():
            raise ValueError("Tick is local to one machine: a replicated log carries TimedOut")
    record = {"e": body, "by": entry.by, "n": entry.serial, "pid": entry.pid}
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def decode_entry(raw: bytes) -> LogEntry:
    """The entry ``raw`` encodes; :class:`GenerationLogError` if it encodes none."""
    try:
        record = json.loads(raw)
        body, by, serial, pid = record["e"], str(record["by"]), int(record["n"]), record["pid"]
        (kind,) = (k for k in body if k != "first")
        value = body[kind]
        event: Event | Begin
        match kind:
            case "begin":
                nodes = {int(n): NodeSpec(int(size), int(spares)) for n, size, spares in value}
                event = Begin(nodes, int(body["first"]))
            case "ready":
                event = Ready(WorkerKey(int(value[0]), int(value[1])))
            case "entered":
                event = Entered(WorkerKey(int(value[0]), int(value[1])), int(value[2]))
            case "exited":
                event = Exited(WorkerKey(int(value[0]), int(value[1])), int(value[2]))
            case "lost":
                event = NodeLost(int(value))
            case "left":
                event = NodeLost(int(value), left=True)
            case "joined":
                event = NodeJoined(int(value[0]), NodeSpec(int(value[1]), int(value[2])))
            case "timeout":
                event = TimedOut(int(value))
            case "leave":
                key = WorkerKey(int(value[0]), int(value[1]))
                event = LeaveDue(key, int(value[2]), EvictCause(value[3]), str(value[4]))
            case "troubled":
                event = Troubled(WorkerKey(int(value[0]), int(value[1])), int(value[2]))
            case "verdict":
                key = WorkerKey(int(value[0]), int(value[1]))
                event = VerdictDue(key, int(value[2]), bool(value[3]))
            case _:
                raise GenerationLogError(raw, f"unknown kind {kind!r}")
    except GenerationLogError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise GenerationLogError(raw, f"{type(exc).__name__}: {exc}") from None
    return LogEntry(event, by, serial, None if pid is None else int(pid))


# -- many nodes -------------------------------------------------------------------------------
# Across nodes, every agent runs a replica of one machine for the whole job (see "the replicated
# log" above). An *epoch* is one such machine's life: it begins in a rendezvous
# round in which no node runs in-place workers (its number is that round's), and it lives on
# through later rounds (nodes lost or joining) until it finishes or falls back to a restart.
# Each round, every node writes a :class:`NodeRecord` next to its slot in the round's store;
# :func:`plan_epoch` then tells each node, alike, whether to begin an epoch, stay in its own,
# join the live one, or leave a stale one.

INPLACE_RECORD_PREFIX = "aioelastic/agent/inplace/"
"""In a round's store, where each group rank's :class:`NodeRecord` goes."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a node says about itself in a round, under in-place recovery across nodes."""

    node: int
    """Its rendezvous node id (stable while its agent lives)."""
    spec: NodeSpec
    epoch: int
    """The epoch its workers run in (0: none: it has no in-place workers running)."""
    last_generation: int
    """The highest generation number it has seen (numbers go on across epochs)."""

    def encode(self) -> bytes:
        spec = [self.spec.local_world_size, self.spec.spares]
        return json.dumps([self.node, spec, self.epoch, self.last_generation]).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NodeRecord:
        try:
            node, (size, spares), epoch, last = json.loads(raw)
            return cls(int(node), NodeSpec(int(size), int(spares)), int(epoch), int(last))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"bad in-place node record {raw[:200]!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """What one node does with a round (see :func:`plan_epoch`)."""

    action: str
    """``begin`` a new epoch, ``stay`` in its own, ``join`` the live one, ``leave`` a stale one."""
    epoch: int
    begin: Begin | None = None
    """For ``begin``: the log's first entry (every node computes the same)."""
    members: frozenset[int] = frozenset()
    """The nodes of the round."""


def plan_epoch(node: int, records: Sequence[NodeRecord], round_: int) -> EpochPlan:
    """Decide, as every node of round ``round_`` decides alike, what ``node`` does.

    No node runs an epoch: they begin one numbered ``round_`` with every node of the round.
    Otherwise the newest live epoch goes on: its nodes stay, nodes without one join it, and a
    node of an older epoch leaves it (its workers stop; it joins afresh next round).
    """
    members = frozenset(r.node for r in records)
    mine = next(r for r in records if r.node == node)
    live = max((r.epoch for r in records), default=0)
    if live == 0:
        first = 1 + max(r.last_generation for r in records)
        begin = Begin({r.node: r.spec for r in records}, first)
        return EpochPlan("begin", round_, begin, members)
    if mine.epoch == live:
        return EpochPlan("stay", live, members=members)
    if mine.epoch == 0:
        return EpochPlan("join", live, members=members)
    return EpochPlan("leave", mine.epoch, members=members)
