"""What a node's agent publishes, decoded and formatted for ``aioelastic status`` (pure).

From the round's store: each node's in-place world (generation, pids, spares) and the stacks its
agent captured on request. From the node's metrics endpoint: the armed watchdog timers and the
learned timeouts. The rendezvous keys themselves are :mod:`aioelastic.rendezvous._status`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from aioelastic.agent._generations import GENERATION_PREFIX
from aioelastic.agent._stack_requests import RankStack
from aioelastic.agent._stacks import diagnose
from aioelastic.rendezvous._status import (
    GenerationStatus,
    PreemptionStatus,
    StepTimesStatus,
    under,
)

STEP_TIMES_PREFIX = "aioelastic/agent/steps/"
"""In a round's store, where each node shows its last straggler window (``aioelastic status``)."""


def step_times_key(group_rank: int) -> str:
    """Where the node of ``group_rank`` shows its last straggler window."""
    return f"{STEP_TIMES_PREFIX}{group_rank}"


def encode_step_times(window_end: float, medians: Mapping[int, float], factor: float) -> bytes:
    """What a node shows of its last straggler window: its ranks' median step times."""
    return json.dumps(
        {
            "window_end": window_end,
            "medians": {str(r): m for r, m in medians.items()},
            "factor": factor,
        }
    ).encode()


def read_step_times(items: Mapping[str, bytes], round_: int) -> tuple[StepTimesStatus, ...]:
    """The straggler windows the nodes of round ``round_`` showed (keys as for
    ``read_status``)."""
    found = []
    for key, value in sorted(under(items, f"store/{round_}/{STEP_TIMES_PREFIX}").items()):
        try:
            data = json.loads(value)
            medians = {int(r): float(m) for r, m in data["medians"].items()}
            found.append(
                StepTimesStatus(
                    int(key.rsplit("/", 1)[1]),
                    float(data["window_end"]),
                    medians,
                    float(data["factor"]),
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not ours, or another version's: status shows what it can read
    return tuple(found)


def read_generations(items: Mapping[str, bytes], round_: int) -> tuple[GenerationStatus, ...]:
    """The in-place worlds the nodes of round ``round_`` published (keys as for ``read_status``)."""
    found = []
    for key, value in sorted(under(items, f"store/{round_}/{GENERATION_PREFIX}").items()):
        try:
            data = json.loads(value)
            found.append(
                GenerationStatus(
                    int(key.rsplit("/", 1)[1]),
                    int(data["generation"]),
                    str(data["phase"]),
                    tuple(int(p) for p in data["pids"]),
                    tuple(int(p) for p in data["spares"]),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue  # not ours, or another version's: status shows what it can read
    return tuple(found)


def read_preemption(items: Mapping[str, bytes], round_: int) -> PreemptionStatus | None:
    """The preemption of round ``round_`` as its agents published it (None: not preempted)."""
    from aioelastic.agent import _preemption as p
    from aioelastic.agent._report import signal_name
    from aioelastic.worker._stop_step import decode_claim

    keys = under(items, f"store/{round_}/{p.PREFIX}")
    base = f"store/{round_}/"
    raw = keys.get(base + p.NOTICE_KEY)
    if raw is None:
        return None
    try:
        notice = p.PreemptionRecord.decode(raw)
        stop = keys.get(base + p.STOP_KEY)
        ended = {
            int(key.rsplit("/", 1)[1]): json.loads(value)
            for key, value in keys.items()
            if key.startswith(base + p.ENDED_PREFIX)
        }
        return PreemptionStatus(
            by_node=notice.node,
            signal="notice file" if notice.source == "file" else signal_name(notice.signal),
            timeout=notice.timeout,
            stop_step=None if stop is None else decode_claim(stop),
            ready_nodes=int(keys.get(base + p.READY_KEY, b"0")),
            ended=ended,
        )
    except (ValueError, KeyError, TypeError):
        return None  # another version's keys: status shows what it can read


def format_timers(node: str, timers: Sequence[Mapping[str, Any]]) -> str:
    """The watchdog timers armed on ``node`` (as its metrics endpoint lists them), soonest first."""
    if not timers:
        return f"node {node}: no watchdog timer armed"
    lines = [f"node {node}: {len(timers)} watchdog timer{'' if len(timers) == 1 else 's'} armed"]
    lines.append(f"  {'pid':>7}  {'left (s)':>9}  scope")
    for timer in timers:
        left = float(timer["seconds_left"])
        lines.append(f"  {timer['pid']:>7}  {left:>9.1f}  {timer['scope_id']}")
    return "\n".join(lines)


def stacks_data(
    answers: Mapping[int, Sequence[RankStack]], silent: Sequence[int]
) -> dict[str, Any]:
    """What ``status --stacks`` found, as data: the grouping, suspects and each rank's capture."""
    stacks = sorted((s for node in answers.values() for s in node), key=lambda s: s.record.rank)
    diagnosis = diagnose({s.record.rank: s.place for s in stacks})
    return {
        "summary": diagnosis.summary,
        "suspects": list(diagnosis.suspects),
        "silent_nodes": list(silent),
        "ranks": [
            {
                "rank": s.record.rank,
                "node": node,
                "pid": s.record.pid,
                "place": s.record.place,
                "method": s.record.method,
                "stack_file": s.record.stack_file,
                "reason": s.record.reason,
            }
            for node, ranks in sorted(answers.items())
            for s in ranks
        ],
    }


def format_stacks(run_id: str, data: Mapping[str, Any]) -> str:
    """The human form of :func:`stacks_data`."""
    lines = [f"run {run_id!r} stacks: {data['summary']}"]
    suspects = ", ".join(map(str, data["suspects"])) or "none"
    lines.append(f"  suspects: {suspects}")
    if data["silent_nodes"]:
        lines.append(f"  no answer from node(s): {', '.join(map(str, data['silent_nodes']))}")
    lines.append(f"  {'rank':>4}  {'node':>4}  {'pid':>7}  place / stack file")
    for rank in sorted(data["ranks"], key=lambda r: r["rank"]):
        where = rank["place"] or f"no stack ({rank['reason']})"
        lines.append(f"  {rank['rank']:>4}  {rank['node']:>4}  {rank['pid']:>7}  {where}")
        if rank["stack_file"]:
            lines.append(f"  {'':>4}  {'':>4}  {'':>7}  {rank['stack_file']}")
    return "\n".join(lines)


def format_learned(node: str, learned: Mapping[str, Mapping[str, float]]) -> str:
    """The limits a node's ``expires(after="auto")`` scopes learned (as ``/learned`` lists them)."""
    if not learned:
        return f"node {node}: no learned timeout yet"
    lines = [f"node {node}: learned timeouts"]
    lines.append(f"  {'limit (s)':>9}  {'longest (s)':>11}  {'blocks':>6}  scope")
    for scope, item in learned.items():
        lines.append(
            f"  {item['limit']:>9.1f}  {item['longest']:>11.1f}  "
            f"{int(item['observations']):>6}  {scope}"
        )
    return "\n".join(lines)
