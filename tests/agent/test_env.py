"""Rank assignment and the worker environment (pure functions)."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent import WorkerSpec
from aioelastic.agent._env import NodeSlot, RoundInfo, assign_ranks, worker_env

slots = st.lists(
    st.builds(NodeSlot, st.sampled_from(["trainer", "reader"]), st.integers(1, 8)),
    min_size=1,
    max_size=12,
)


@given(slots)
def test_global_ranks_cover_the_world_exactly_once(nodes: list[NodeSlot]) -> None:
    """Across all nodes, global ranks are exactly 0..world_size-1 in group-rank order."""
    ranks = [r for g in range(len(nodes)) for r in assign_ranks(nodes, g)]
    world = sum(n.local_world_size for n in nodes)
    assert [r.rank for r in ranks] == list(range(world))
    assert {r.world_size for r in ranks} == {world}


@given(slots)
def test_role_ranks_are_dense_within_each_role(nodes: list[NodeSlot]) -> None:
    """Within a role, role ranks are exactly 0..role_world_size-1."""
    for role in {n.role for n in nodes}:
        ranks = [r for g, n in enumerate(nodes) if n.role == role for r in assign_ranks(nodes, g)]
        size = sum(n.local_world_size for n in nodes if n.role == role)
        assert sorted(r.role_rank for r in ranks) == list(range(size))
        assert {r.role_world_size for r in ranks} == {size}


@given(slots)
def test_slot_round_trips_through_its_stored_form(nodes: list[NodeSlot]) -> None:
    """What one node stores for the others decodes to the same slot."""
    for node in nodes:
        assert NodeSlot.decode(node.encode().encode()) == node


def test_group_rank_outside_the_nodes_is_refused() -> None:
    """Asking for a node that is not in the round is a clear error."""
    with pytest.raises(ValueError, match="group rank 2 is outside the 2 nodes"):
        assign_ranks([NodeSlot("r", 1), NodeSlot("r", 1)], 2)


def _env(local_world_size: int, base: dict[str, str], timer: str | None) -> dict[str, str]:
    spec = WorkerSpec(sys.executable, None, local_world_size=local_world_size, max_restarts=5)
    info = RoundInfo("job", 1, 2, "10.0.0.1", 29501, restart_count=2, round=9)
    ranks = assign_ranks([NodeSlot("default", local_world_size)] * 2, 1)[-1]
    return worker_env(base, spec, info, ranks, error_file="/tmp/e.json", timer_file=timer)


def test_worker_env_has_torch_variables() -> None:
    """Every variable torch's agent sets is there with the right value, and the round."""
    env = _env(4, {"PATH": os.defpath}, "/run/fifo")
    expected = {
        "RANK": "7",
        "LOCAL_RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "7",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29501",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json",
        "TORCHELASTIC_TIMER_FILE": "/run/fifo",
        "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "AIOELASTIC_ROUND": "9",
        "PATH": os.defpath,
    }
    assert env == expected


def test_user_settings_win_over_defaults() -> None:
    """OMP_NUM_THREADS and TORCH_NCCL_ASYNC_ERROR_HANDLING set by the user are kept."""
    env = _env(4, {"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, None)
    assert (env["OMP_NUM_THREADS"], env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]) == ("8", "0")


def test_single_worker_and_no_watchdog() -> None:
    """One worker per node gets no OMP_NUM_THREADS; without the watchdog no timer file."""
    env = _env(1, {"TORCHELASTIC_TIMER_FILE": "/stale"}, None)
    assert "OMP_NUM_THREADS" not in env
    assert "TORCHELASTIC_TIMER_FILE" not in env
