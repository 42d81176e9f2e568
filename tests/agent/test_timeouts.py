"""The start-up timeout check: each rule refuses what cannot work, naming both values."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from aioelastic.agent import ElasticAgent, WorkerSpec
from aioelastic.agent._timeouts import (
    RULES,
    TimeoutConflictError,
    agent_timeouts,
    check_timeouts,
    timeout_conflicts,
)
from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aioelastic.store import MemoryStore
from tests.agent.conftest import BOUND, launched

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "agent.md"
DEFAULTS = {
    "heartbeat_timeout": 15.0,
    "keep_alive_interval": 5.0,
    "join_timeout": 600.0,
    "last_call_timeout": 30.0,
    "recovery_timeout": 60.0,
}


def refusal(**changes: float) -> str:
    """The message refusing the defaults with ``changes``."""
    with pytest.raises(TimeoutConflictError) as caught:
        check_timeouts({**DEFAULTS, **changes})
    return str(caught.value)


def test_the_defaults_work_together() -> None:
    """Every default setting passes every rule."""
    assert timeout_conflicts(DEFAULTS) == []


def test_a_heartbeat_timeout_not_twice_the_keep_alive_interval_is_refused() -> None:
    """One late keep-alive must not make a live node lost."""
    assert refusal(heartbeat_timeout=6, keep_alive_interval=5).startswith(
        "heartbeat_timeout=6 s (--rdzv-conf heartbeat_timeout) must be at least 2 x "
        "keep_alive_interval=5 s (--rdzv-conf keep_alive_interval): a node would be declared lost"
    )


def test_a_last_call_longer_than_the_join_timeout_is_refused() -> None:
    """The join would time out inside the last call."""
    assert refusal(last_call_timeout=120, join_timeout=60).startswith(
        "join_timeout=60 s (--rdzv-conf join_timeout) must be at least last_call_timeout=120 s"
    )


def test_a_join_timeout_shorter_than_the_heartbeat_timeout_is_refused() -> None:
    """A node dying during the join would be noticed after the join failed."""
    assert refusal(join_timeout=10, last_call_timeout=1).startswith(
        "join_timeout=10 s (--rdzv-conf join_timeout) must be at least heartbeat_timeout=15 s"
    )


def test_a_recovery_timeout_shorter_than_the_heartbeat_timeout_is_refused() -> None:
    """An in-place recovery must be able to wait until a lost node is known lost."""
    assert refusal(recovery_timeout=10).startswith(
        "recovery_timeout=10 s (--recovery-timeout) must be at least heartbeat_timeout=15 s"
    )


def test_unset_values_are_not_compared() -> None:
    """A rule whose values are not both in play (no recovery timeout, a static rendezvous)
    does not apply."""
    assert timeout_conflicts({"heartbeat_timeout": 15.0, "recovery_timeout": 1.0}) != []
    assert timeout_conflicts({"recovery_timeout": 1.0, "join_timeout": 1.0}) == []


def test_the_agent_guide_lists_every_rule() -> None:
    """Each rule's text appears in the agent guide (docs/guides/agent.md)."""
    text = GUIDE.read_text()
    assert [rule.text for rule in RULES if f"`{rule.text}`" not in text] == []


@pytest.mark.anyio
async def test_the_agent_refuses_before_starting_anything() -> None:
    """ElasticAgent.run() raises the conflict before it starts a worker or the watchdog."""
    params = RendezvousParameters(
        "memory",
        "timeouts",
        "job",
        1,
        1,
        store=MemoryStore(),
        keep_alive_interval="5",
        heartbeat_timeout="7",
    )
    async with get_rendezvous_handler(params) as handler:
        spec = WorkerSpec("/bin/true", handler)
        assert agent_timeouts(spec)["heartbeat_timeout"] == 7.0
        agent = ElasticAgent(spec)
        with pytest.raises(TimeoutConflictError, match="heartbeat_timeout=7 s"):
            await agent.run()
        assert agent.statistics().workers_started == 0


@pytest.mark.anyio
async def test_aioelastic_run_refuses_with_one_line_naming_both_values() -> None:
    """The launcher exits 2 with the conflict on one line."""
    argv = ["--standalone", "--rdzv-conf", "join_timeout=20,last_call_timeout=30", "/bin/true"]
    with anyio.fail_after(BOUND):
        async with launched("--no-python", *argv) as run:
            status = await run.wait()
    assert status == 2, run
    assert (
        "join_timeout=20 s (--rdzv-conf join_timeout) must be at least last_call_timeout=30 s"
        in (run.err.text)
    )


@pytest.mark.anyio
async def test_the_recovery_rule_needs_in_place_recovery_and_other_nodes() -> None:
    """recovery_timeout is compared only when in-place recovery may wait for a lost node."""
    store = MemoryStore()
    for max_nodes, recovery, expected in ((2, "in-place", True), (1, "in-place", False)):
        params = RendezvousParameters("memory", "rules", "job", 1, max_nodes, store=store)
        async with get_rendezvous_handler(params) as handler:
            spec = WorkerSpec("/bin/true", handler, recovery=recovery, recovery_timeout=1)
            assert ("recovery_timeout" in agent_timeouts(spec)) is expected
    params = RendezvousParameters("memory", "rules2", "job", 1, 2, store=store)
    async with get_rendezvous_handler(params) as handler:
        assert "recovery_timeout" not in agent_timeouts(WorkerSpec("/bin/true", handler))
