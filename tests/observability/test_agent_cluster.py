"""The test kit runs real agents on simulated nodes: one loop, real workers, faults per node."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from aioelastic.agent import RunState, WorkerSpec
from aioelastic.testing import EventRecorder, Node, RendezvousCluster

pytestmark = pytest.mark.anyio

BOUND = 60
"""Generous bound (seconds) for real worker processes on a loaded 2-core machine."""

WORKER = """\
import os, signal
if os.environ["GROUP_WORLD_SIZE"] != "1":
    signal.pause()  # a two-node job never ends by itself: it is waiting for the crash
"""


def spec(script: Path) -> Callable[[Node], WorkerSpec]:
    def make(node: Node) -> WorkerSpec:
        return WorkerSpec(
            sys.executable, node.handler, args=(str(script),), max_restarts=0, shutdown_timeout=5
        )

    return make


async def test_agents_on_two_nodes_form_one_job(tmp_path: Path) -> None:
    """Two agents over the kit's store form one group of two nodes and succeed together."""
    script = tmp_path / "worker.py"
    script.write_text("pass\n")
    async with RendezvousCluster(2) as cluster:
        recorder = EventRecorder()
        cluster.events.subscribe(recorder)
        with anyio.fail_after(BOUND):
            await cluster.start_agents(spec(script))
            results = await cluster.wait_agents()
    assert [r.state for r in results] == [RunState.SUCCEEDED] * 2
    completed = recorder.of("RendezvousCompleted")
    assert sorted(r.node for r in completed) == ["node0", "node1"]
    assert {r.event.group_world_size for r in completed} == {2}


async def test_a_crashed_node_makes_the_survivor_regroup_without_a_restart(
    tmp_path: Path,
) -> None:
    """Crashing one node's agent and handler: the other re-forms alone and finishes."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    async with RendezvousCluster(2, min_nodes=1, max_nodes=2) as cluster:
        recorder = EventRecorder()
        cluster.events.subscribe(recorder)
        survivor, victim = cluster.nodes
        with anyio.fail_after(BOUND):
            await cluster.start_agents(spec(script))
            await recorder.wait_for("WorkersStarted", node="node0")
            await recorder.wait_for("WorkersStarted", node="node1")
            await cluster.crash(victim)
            await cluster.advance(cluster.settings.heartbeat_timeout + 1)
            await recorder.wait_for("WorkersStopped", node=survivor.name)
            await anyio.wait_all_tasks_blocked()
            await cluster.advance(cluster.settings.last_call_timeout + 1)
            result = await survivor.wait_agent()
    assert result.state is RunState.SUCCEEDED
    assert result.restart_count == 0
    changes = recorder.of("MembershipChanged", node=survivor.name)
    assert [c.event.reason for c in changes] == ["PARTICIPANT_LOST"]
