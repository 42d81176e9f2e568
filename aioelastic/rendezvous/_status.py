"""A job's state as its rendezvous store knows it: pure decoding and a plain-text table.

Reads the elastic rendezvous keys of one run (the layout of :mod:`aioelastic.rendezvous._layout`)
from a snapshot and says: the last sealed round and its participants (rank, node id, host,
alive or not), the nodes waiting for the next round, nodes reported lost, and whether the run
is closed. Liveness is the store's verdict (a node's TTL key exists), never a clock comparison;
so is a heartbeat's age: the TTL the node wrote its liveness key with (recorded in the value)
minus the time the store says that key has left, both on the store's own clock. What the agents
publish beside those keys (in-place generations) is decoded by the agent's layer and handed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aioelastic.rendezvous import _layout as layout


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node of a round: its id, rank (-1 while waiting), host and liveness."""

    node: int
    rank: int
    addr: str
    alive: bool
    heartbeat_age: float | None = None
    """Seconds since the node's last heartbeat, on the store's clock (None: unknown or dead)."""
    heartbeat_left: float | None = None
    """Seconds before the node's liveness key expires (None: unknown or dead)."""


@dataclass(frozen=True, slots=True)
class GenerationStatus:
    """One node's world under in-place recovery: its generation, its pids by rank, its spares."""

    group_rank: int
    generation: int
    phase: str
    pids: tuple[int, ...]
    spares: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepTimesStatus:
    """A node's last straggler window (from its workers' ``world.step`` marks): each of its
    ranks' median step time in seconds, and the factor a straggler is slower by."""

    group_rank: int
    window_end: float
    medians: Mapping[int, float]
    factor: float


def job_stragglers(step_times: Sequence[StepTimesStatus]) -> dict[int, float]:
    """The ranks of every node slower than the factor times the fastest rank of the job, with
    their score (the fastest median over theirs)."""
    medians = {rank: m for node in step_times for rank, m in node.medians.items() if m > 0}
    if len(medians) < 2:
        return {}
    fastest = min(medians.values())
    factor = max(node.factor for node in step_times)
    return {r: fastest / m for r, m in sorted(medians.items()) if m > factor * fastest}


@dataclass(frozen=True, slots=True)
class PreemptionStatus:
    """A job-wide preemption of the last round, as the agents published it."""

    by_node: int
    signal: str
    timeout: float
    stop_step: int | None
    """The agreed stop step (None: not agreed, or no rank on the worker API)."""
    ready_nodes: int
    ended: Mapping[int, Mapping[str, object]]
    """Group rank -> what its ranks did (saved, no_boundary, unsaved, since_notice)."""


@dataclass(frozen=True, slots=True)
class RunStatus:
    """The rendezvous state of one run."""

    run_id: str
    round: int
    """The last sealed round (0: none yet)."""
    closed: bool
    participants: tuple[NodeStatus, ...]
    waiting: tuple[NodeStatus, ...]
    lost: Mapping[int, str]
    """Members of the last round reported gone, with the reason given."""
    nodes_seen: int
    """Node ids handed out so far (every handler that ever entered)."""
    generations: tuple[GenerationStatus, ...] = ()
    """Nodes running ``--recovery in-place``: their world's generation and spares."""
    step_times: tuple[StepTimesStatus, ...] = ()
    """Nodes whose workers mark their steps: their last straggler window."""

    preemption: PreemptionStatus | None = None
    """The last round's preemption, if the job was preempted."""


def read_status(
    run_id: str,
    items: Mapping[str, bytes],
    ttl_left: Mapping[int, float] | None = None,
    *,
    generations: Sequence[GenerationStatus] = (),
) -> RunStatus:
    """Decode ``items`` (keys relative to the run's ``rdzv/<run_id>/`` namespace).

    ``ttl_left`` maps node ids to the seconds their liveness key has left, as the store said;
    ``generations`` are the in-place worlds the agents published (see
    :func:`aioelastic.agent._status.read_generations`).
    """
    latest = int(items.get(layout.LATEST_KEY, b"0"))
    alive = layout.parse_alive(items)
    left = ttl_left or {}

    def node_status(node: int, rank: int, addr: str) -> NodeStatus:
        if node not in alive:
            return NodeStatus(node, rank, addr, False)
        remaining = left.get(node)
        timeout = layout.parse_heartbeat_timeout(items[layout.alive_key(node)])
        age = None if remaining is None or timeout is None else max(0.0, timeout - remaining)
        return NodeStatus(node, rank, addr, True, age, remaining)

    result_data = items.get(layout.result_key(latest)) if latest else None
    participants: tuple[NodeStatus, ...] = ()
    if result_data is not None and result_data != layout.CLOSED_RESULT:
        result = layout.RoundResult.decode(latest, result_data)
        joined = layout.parse_records(under(items, layout.join_prefix(latest)))
        participants = tuple(
            node_status(node, rank, joined[node].addr if node in joined else "?")
            for rank, node in enumerate(result.members)
        )
    upcoming = layout.parse_records(under(items, layout.join_prefix(latest + 1)))
    waiting = tuple(node_status(node, -1, record.addr) for node, record in sorted(upcoming.items()))
    lost_prefix = f"{layout.round_prefix(latest + 1)}lost/"
    lost = {
        int(key.rsplit("/", 1)[1]): value.decode("utf-8", "replace")
        for key, value in items.items()
        if key.startswith(lost_prefix)
    }
    return RunStatus(
        run_id=run_id,
        round=latest,
        closed=layout.CLOSED_KEY in items,
        participants=participants,
        waiting=waiting,
        lost=lost,
        nodes_seen=int(items.get(layout.NODE_IDS_KEY, b"0")),
        generations=tuple(generations),
    )


def under(items: Mapping[str, bytes], prefix: str) -> dict[str, bytes]:
    """The items whose key starts with ``prefix``."""
    return {key: value for key, value in items.items() if key.startswith(prefix)}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def format_status(status: RunStatus) -> str:
    """A short human-readable report of ``status``."""
    state = "closed" if status.closed else "open"
    lines = [
        f"run {status.run_id!r}: round {status.round}, {state}, "
        f"{_count(len(status.participants), 'participant')}, {len(status.waiting)} waiting, "
        f"{_count(status.nodes_seen, 'node id')} handed out",
    ]
    if status.participants or status.waiting:
        lines.append(f"  {'rank':>4}  {'node':>5}  {'alive':5}  {'last heartbeat':>14}  host")
    for node in status.participants:
        lost = f"  (reported lost: {status.lost[node.node]})" if node.node in status.lost else ""
        lines.append(f"  {node.rank:>4}  {_node_columns(node)}{lost}")
    for node in status.waiting:
        lines.append(f"  {'wait':>4}  {_node_columns(node)}")
    for world in status.generations:
        spares = ", ".join(map(str, world.spares)) or "none"
        lines.append(
            f"  node of rank {world.group_rank}: generation {world.generation} ({world.phase}), "
            f"world size {len(world.pids)}, pids {' '.join(map(str, world.pids))}; "
            f"spares ready: {spares}"
        )
    lines += _format_step_times(status.step_times)

    if status.preemption is not None:
        lines.extend(_preemption_lines(status.preemption))
    if not status.round and not status.waiting:
        lines.append("  no node has joined this run yet (check --rdzv-id)")
    return "\n".join(lines)


def _format_step_times(step_times: Sequence[StepTimesStatus]) -> list[str]:
    """Each rank's median step time (the last window of its node), and the stragglers."""
    medians = sorted((r, m) for node in step_times for r, m in node.medians.items())
    if not medians:
        return []
    shown = ", ".join(f"{rank}: {median * 1000:.1f}" for rank, median in medians)
    lines = [f"  median step time (ms) by rank, last window: {shown}"]
    stragglers = job_stragglers(step_times)
    named = ", ".join(f"rank {r} (score {score:.2f})" for r, score in stragglers.items())
    lines.append(f"  stragglers: {named or 'none'}")
    return lines


def _preemption_lines(preemption: PreemptionStatus) -> list[str]:
    step = preemption.stop_step
    agreed = "not agreed yet" if step is None else f"stop step {step}"
    lines = [
        f"  preempted by node {preemption.by_node} ({preemption.signal}, "
        f"{preemption.timeout:g} s deadline): {agreed}, "
        f"{_count(preemption.ready_nodes, 'node')} ready"
    ]
    for node, ended in sorted(preemption.ended.items()):
        parts = [f"saved {_ranks(ended.get('saved'))}"]
        for key, what in (("no_boundary", "no step boundary"), ("unsaved", "not saved")):
            if ended.get(key):
                parts.append(f"{what} {_ranks(ended.get(key))}")
        since = ended.get("since_notice")
        took = f" ({since:.2f} s after the notice)" if isinstance(since, float) else ""
        lines.append(f"  node of rank {node}: {'; '.join(parts)}{took}")
    return lines


def _ranks(value: object) -> str:
    ranks = list(value) if isinstance(value, list | tuple) else []
    return "ranks " + ", ".join(map(str, ranks)) if ranks else "none"


def _heartbeat(node: NodeStatus) -> str:
    if node.heartbeat_age is not None:
        return f"{node.heartbeat_age:.0f}s ago"
    if node.heartbeat_left is not None:
        return f"({node.heartbeat_left:.0f}s left)"
    return "-"


def _node_columns(node: NodeStatus) -> str:
    alive = "yes" if node.alive else "NO"
    return f"{node.node:>5}  {alive:5}  {_heartbeat(node):>14}  {node.addr}"
