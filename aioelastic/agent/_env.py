"""Pure pieces of starting a worker group: rank assignment and each worker's environment.

Nodes (agents) get a group rank from the rendezvous; workers are numbered across nodes in
group-rank order, so node ``g`` with ``n`` workers holds the ``n`` global ranks after those of
nodes ``0..g-1``. Role ranks count the same way among the nodes of one role. The environment
is the one torch's agent gives its workers, so training scripts run unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aioelastic.agent._spec import WorkerSpec


@dataclass(frozen=True, slots=True)
class NodeSlot:
    """What one node contributes to the job: its role and its number of workers."""

    role: str
    local_world_size: int

    def encode(self) -> str:
        """Return the form stored for the other nodes to read."""
        return f"{self.local_world_size}:{self.role}"

    @classmethod
    def decode(cls, raw: bytes) -> NodeSlot:
        """Parse what :meth:`encode` wrote."""
        size, _, role = raw.decode().partition(":")
        return cls(role, int(size))


@dataclass(frozen=True, slots=True)
class WorkerRanks:
    """One worker's place in the job."""

    local_rank: int
    rank: int
    world_size: int
    role_rank: int
    role_world_size: int


def assign_ranks(nodes: Sequence[NodeSlot], group_rank: int) -> list[WorkerRanks]:
    """Return the ranks of the workers of node ``group_rank``, given every node's slot."""
    if not 0 <= group_rank < len(nodes):
        raise ValueError(f"group rank {group_rank} is outside the {len(nodes)} nodes")
    mine = nodes[group_rank]
    base = sum(n.local_world_size for n in nodes[:group_rank])
    world_size = sum(n.local_world_size for n in nodes)
    same_role = [n for n in nodes if n.role == mine.role]
    role_base = sum(n.local_world_size for n in nodes[:group_rank] if n.role == mine.role)
    role_world_size = sum(n.local_world_size for n in same_role)
    return [
        WorkerRanks(
            local_rank=local,
            rank=base + local,
            world_size=world_size,
            role_rank=role_base + local,
            role_world_size=role_world_size,
        )
        for local in range(mine.local_world_size)
    ]


@dataclass(frozen=True, slots=True)
class RoundInfo:
    """What every worker of one attempt shares: the rendezvous outcome and the attempt count."""

    run_id: str
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    restart_count: int
    use_agent_store: bool = False
    round: int = 0
    """The rendezvous round (``AIOELASTIC_ROUND``): a stale world's writes can be fenced by it."""


def worker_env(
    base: Mapping[str, str],
    spec: WorkerSpec,
    info: RoundInfo,
    ranks: WorkerRanks,
    *,
    error_file: str,
    timer_file: str | None,
) -> dict[str, str]:
    """Return the environment of one worker: ``base`` plus ``spec.env`` plus torch's variables."""
    env = {**base, **spec.env}
    env.update(
        RANK=str(ranks.rank),
        LOCAL_RANK=str(ranks.local_rank),
        WORLD_SIZE=str(ranks.world_size),
        LOCAL_WORLD_SIZE=str(spec.local_world_size),
        GROUP_RANK=str(info.group_rank),
        GROUP_WORLD_SIZE=str(info.group_world_size),
        ROLE_NAME=spec.role,
        ROLE_RANK=str(ranks.role_rank),
        ROLE_WORLD_SIZE=str(ranks.role_world_size),
        MASTER_ADDR=info.master_addr,
        MASTER_PORT=str(info.master_port),
        TORCHELASTIC_RESTART_COUNT=str(info.restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(spec.max_restarts),
        TORCHELASTIC_RUN_ID=info.run_id,
        TORCHELASTIC_USE_AGENT_STORE=str(info.use_agent_store),
        TORCHELASTIC_ERROR_FILE=error_file,
        AIOELASTIC_ROUND=str(info.round),
    )
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if spec.local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    if timer_file is None:
        env.pop("TORCHELASTIC_TIMER_FILE", None)
    else:
        env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1"
        env["TORCHELASTIC_TIMER_FILE"] = timer_file
    return env
