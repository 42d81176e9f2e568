"""A job-wide preemption on three hosts (network namespaces), two workers each: SIGTERM to one
agent stops every rank of the job at one step (on the worker API) or runs every plain worker's
SIGTERM handler, on every node; the exit status and the events say so."""

from __future__ import annotations

import importlib.util
import re
import signal

import pytest

from tests.network._preemption import API_WORKER, PLAIN_WORKER, Trial, trial

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

HAS_TORCH = importlib.util.find_spec("torch") is not None
PREEMPTED = 128 + signal.SIGTERM


def check_saved_at_one_step(t: Trial, statuses: list[int | None], signalled: int) -> int:
    """Every rank saved at one step, every agent says so and exits 128 + SIGTERM; the events
    name the node, the step and each rank's save. Returns the step."""
    consoles = t.job.consoles()
    saved = t.saved()
    assert sorted(saved) == list(range(6)), consoles
    steps = {record["step"] for record in saved.values()}
    assert len(steps) == 1, (saved, consoles)
    (step,) = steps
    assert statuses == [PREEMPTED] * 3, consoles
    for host in t.net.hosts:
        agent = t.job.agent(host)
        assert f"run preempted, saved at step {step} (node " in agent.console, consoles
        (noticed,) = t.events(host, "PreemptionNoticed")
        assert noticed["signal"] == signal.SIGTERM
        assert len(noticed["api_ranks"]) == 2
        assert [e["step"] for e in t.events(host, "StopStepAgreed")] == [step]
        assert sorted(e["step"] for e in t.events(host, "RankSaved")) == [step, step]
        (ended,) = t.events(host, "PreemptionEnded")
        assert ended["no_boundary"] == []
        assert ended["all_stopping"] <= ended["since_notice"]
        assert ended["unsaved"] == []
    (mine,) = t.events(t.net.hosts[signalled], "PreemptionNoticed")
    assert mine["by_node"] == mine["node"]  # the signalled agent's own notice...
    nodes = {t.events(h, "PreemptionNoticed")[0]["by_node"] for h in t.net.hosts}
    assert nodes == {mine["node"]}  # ...is everyone's
    return step


BACKENDS = ["c10d", "etcd"]


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("signalled", [0, 2], ids=["store-host", "other-host"])
async def test_gloo_ranks_on_every_node_save_at_one_step(backend: str, signalled: int) -> None:
    """SIGTERM to one agent mid-training (an all_reduce a step): all six gloo ranks say
    ``should_stop`` at the same step and write their shard; every agent exits preempted."""
    async with trial(gloo=True) as t:
        await t.start(backend, API_WORKER)
        statuses = await t.preempt(t.net.hosts[signalled])
        check_saved_at_one_step(t, statuses, signalled)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_plain_python_ranks_save_at_one_step(backend: str) -> None:
    """Without torch, and without a collective tying the ranks' steps together, the six
    ranks still stop at one step."""
    async with trial() as t:
        await t.start(backend, API_WORKER)
        statuses = await t.preempt(t.net.hosts[1])
        step = check_saved_at_one_step(t, statuses, 1)
        if backend == "etcd":  # the store outlives the agents: status reads what they left
            shown = await t.status(backend)
            assert f"(SIGTERM, 30 s deadline): stop step {step}, 3 nodes ready" in shown, shown
            assert shown.count("node of rank") == 3, shown


async def test_every_plain_worker_on_every_node_runs_its_sigterm_handler() -> None:
    """Plain workers (no API): the signal reaches every local worker on every node, not only
    the node that got it (torchrun: that node's only)."""
    async with trial() as t:
        await t.start("c10d", PLAIN_WORKER)
        statuses = await t.preempt(t.net.hosts[1])
        handled = t.handled()
        assert sorted(handled) == list(range(6)), t.job.consoles()
        assert sorted(set(handled.values())) == sorted(h.addr for h in t.net.hosts)
        printed = sum(a.console.count(": SIGTERM, saving") for a in t.job.agents)
        assert printed == 6, t.job.consoles()  # the handlers' output reached every console
        assert statuses == [PREEMPTED] * 3, t.job.consoles()
        for host in t.net.hosts:
            (noticed,) = t.events(host, "PreemptionNoticed")
            assert noticed["api_ranks"] == []
            assert len(noticed["signalled_ranks"]) == 2
            assert "the signal was forwarded to every worker" in t.job.agent(host).console


async def test_a_rank_that_reaches_no_boundary_before_the_deadline_is_named() -> None:
    """Rank 3 hangs inside a step: no stop step can be agreed, the deadline (2 s) kills what
    runs, and rank 3's node names it in its event and its final line."""
    async with trial(hang_rank=3) as t:
        await t.start("c10d", API_WORKER, options=["--shutdown-timeout", "2"], lines=6)
        await t.wait_count("rank 3 hangs", 1)
        statuses = await t.preempt(t.net.hosts[0])
        assert statuses == [PREEMPTED] * 3, t.job.consoles()
        named = [h for h in t.net.hosts if t.events(h, "PreemptionEnded")[0]["no_boundary"] == [3]]
        assert len(named) == 1, t.job.consoles()
        console = t.job.agent(named[0]).console
        assert "rank 3 reached no step boundary before the deadline" in console
        assert re.search(r"run preempted, no stop step was agreed", console), console
        assert t.saved() == {}
