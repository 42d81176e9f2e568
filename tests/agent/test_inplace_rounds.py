"""``--recovery in-place`` across nodes, where a round ends under a node in its slot exchange:
real agents and workers on the test kit's nodes (one store, faults per node, no sleeps)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import pytest

from aioelastic._concurrency import first_of
from aioelastic.agent import RunState, WorkerSpec
from aioelastic.testing import EventRecorder, Node, RendezvousCluster
from tests.agent.conftest import BOUND
from tests.agent.test_inplace_nodes import PLAIN_WORKER

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """The agents drive subprocesses."""
    return request.param


def plain_job(finish: Path) -> Callable[[Node], WorkerSpec]:
    """Each node's spec: one plain worker under in-place recovery, until ``finish`` exists."""

    def make(node: Node) -> WorkerSpec:
        args = ("-u", PLAIN_WORKER, "--exit-when", str(finish))
        return WorkerSpec(
            sys.executable,
            node.handler,
            args=args,
            recovery="in-place",
            max_restarts=0,
            shutdown_timeout=5,
        )

    return make


async def test_a_round_that_ends_under_one_node_in_its_slot_exchange_is_no_loss(
    tmp_path: Path,
) -> None:
    """Round 1 of nodes a and b ends (c arrives) after both wrote their slots but before a read
    them: b began the in-place epoch and started its worker, a started nothing. In round 2
    a is one of generation 1's like c, not a node lost before it: one world of 3 forms and
    the job finishes with no restart."""
    finish = tmp_path / "finish"
    async with RendezvousCluster(2, min_nodes=2, max_nodes=3, last_call_timeout=1.0) as cluster:
        recorder = EventRecorder()
        cluster.events.subscribe(recorder)
        a, b = cluster.nodes
        held = a.store.stall("multi_get")  # a's reading of the slots (its writes go through)
        with anyio.fail_after(BOUND):
            await cluster.start_agents(plain_job(finish), [a, b])
            while not held.held:
                await cluster.advance(cluster.settings.last_call_timeout)
            await recorder.wait_for("WorkersStarted", node=b.name)
            c = await cluster.add_node()
            await cluster.start_agents(plain_job(finish), [c])
            while not recorder.of("MembershipChanged", node=a.name):
                await cluster.advance(cluster.settings.keep_alive_interval)
            held.release()
            while len([r for r in recorder.of("RoundCompleted") if r.event.round == 2]) < 3:
                await cluster.advance(cluster.settings.keep_alive_interval)
            await first_of(
                partial(recorder.wait_for, "GenerationFormed", 3),
                partial(recorder.wait_for, "RecoveryFellBack"),
            )
            finish.touch()
            results = await cluster.wait_agents()
    assert not recorder.of("RecoveryFellBack"), recorder.of("RecoveryFellBack")
    formed = recorder.of("GenerationFormed")
    assert {(r.node, r.event.generation, r.event.world_size) for r in formed} == {
        (n.name, 1, 3) for n in (a, b, c)
    }
    assert [r.state for r in results] == [RunState.SUCCEEDED] * 3, results
    assert [r.restart_count for r in results] == [0, 0, 0]
