"""Learned timeouts: the rule on a manual clock (warm-up, growth, floor), persistence across a
restart, and ``expires(after="auto")`` against a real in-process timer server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic import timer
from aioelastic.testing import ManualClock
from aioelastic.timer import (
    InvalidDurationError,
    LearnedScope,
    LearnedTimeouts,
    LearningPolicy,
    LocalTimerClient,
    LocalTimerServer,
    learned_limits,
)
from aioelastic.timer._learned import learned_limit, merge

POLICY = LearningPolicy(factor=2.0, floor=10.0, warmup=3, default=600.0)


def steps(learned: LearnedTimeouts, clock: ManualClock, *durations: float) -> list[float]:
    """Run one timed block per duration (the clock moves inside it); the limit each one got."""
    limits = []
    for seconds in durations:
        limits.append(learned.limit("step"))
        started = clock.now()
        clock.advance(seconds)
        learned.observe("step", clock.now() - started)
    return limits


def test_the_warm_up_uses_the_generous_default() -> None:
    """The first ``warmup`` blocks get the default, whatever they took."""
    clock = ManualClock()
    learned = LearnedTimeouts(policy=POLICY, now=clock.now)
    assert steps(learned, clock, 30, 40, 50) == [600.0, 600.0, 600.0]
    assert learned.limit("step") == 100.0


def test_the_limit_grows_with_the_longest_block() -> None:
    """After the warm-up: the longest duration so far times the factor."""
    clock = ManualClock()
    learned = LearnedTimeouts(policy=POLICY, now=clock.now)
    assert steps(learned, clock, 20, 20, 20, 35, 25) == [600.0, 600.0, 600.0, 40.0, 70.0]
    assert learned.limit("step") == 70.0


def test_the_floor_holds_for_quick_blocks() -> None:
    """Blocks far quicker than the floor still get the floor."""
    clock = ManualClock()
    learned = LearnedTimeouts(policy=POLICY, now=clock.now)
    steps(learned, clock, 0.1, 0.2, 0.1)
    assert learned.limit("step") == 10.0


def test_observations_outlive_a_restart(tmp_path: Path) -> None:
    """A worker restarted after learning (a new process, maybe another rank) starts from what
    every rank wrote; ``learned_limits`` shows the same limits to the agent."""
    clock = ManualClock()
    first = LearnedTimeouts(tmp_path, POLICY, now=clock.now, name="0")
    other = LearnedTimeouts(tmp_path, POLICY, now=clock.now, name="1")
    steps(first, clock, 5, 5, 5)
    steps(other, clock, 8)
    restarted = LearnedTimeouts(tmp_path, POLICY, now=clock.now, name="0")
    assert restarted.snapshot() == {"step": LearnedScope(3, 8.0)}
    assert restarted.limit("step") == 16.0
    assert learned_limits(tmp_path, POLICY) == {"step": 16.0}


def test_a_steady_job_stops_writing(tmp_path: Path) -> None:
    """After the warm-up the file changes only when the longest block grows."""
    clock = ManualClock()
    learned = LearnedTimeouts(tmp_path, POLICY, now=clock.now, name="0")
    steps(learned, clock, 5, 5, 5)
    (tmp_path / "0.json").write_text("marker")
    steps(learned, clock, 4, 5, 3)
    assert (tmp_path / "0.json").read_text() == "marker"
    steps(learned, clock, 6)  # a new longest block is written
    assert (tmp_path / "0.json").read_text() != "marker"


@given(st.lists(st.floats(0, 1e6), min_size=POLICY.warmup, max_size=20))
def test_after_the_warm_up_the_limit_covers_every_observed_block(durations: list[float]) -> None:
    """No block that finished would have been reaped under the limit learned from it."""
    scope = LearnedScope()
    for seconds in durations:
        scope = scope.observe(seconds)
    limit = learned_limit(scope, POLICY)
    assert limit >= max(durations)
    assert limit >= POLICY.floor


@given(
    st.lists(
        st.dictionaries(
            st.sampled_from("ab"), st.builds(LearnedScope, st.integers(0, 9), st.floats(0, 9))
        )
    )
)
def test_merging_is_order_free(parts: list[dict[str, LearnedScope]]) -> None:
    """Ranks' files merge to the same thing in any order."""
    assert merge(parts) == merge(reversed(parts))


def test_auto_needs_a_named_scope() -> None:
    """A default (unique) scope can never be learned: refused, saying so."""
    with pytest.raises(InvalidDurationError, match="needs a named scope"):
        timer.expires(after="auto", client=LocalTimerClient.__new__(LocalTimerClient))


@pytest.fixture
async def client() -> AsyncIterator[LocalTimerClient]:
    async with LocalTimerServer("learned", clock=ManualClock(100.0)) as server:
        yield server.client()


@pytest.mark.anyio
async def test_auto_blocks_learn_from_the_ones_that_finished(client: LocalTimerClient) -> None:
    """``expires(after="auto")`` arms the learned limit and observes blocks that finish; a
    block that raised is not an observation."""
    clock = ManualClock()
    learned = LearnedTimeouts(policy=POLICY, now=clock.now)
    armed = []
    for seconds in (4, 6, 5):
        async with timer.expires(after="auto", scope="step", client=client, learned=learned) as e:
            armed.append(e.after)
            clock.advance(seconds)

    def failed_step() -> None:
        with timer.expires(after="auto", scope="step", client=client, learned=learned) as e:
            armed.append(e.after)
            clock.advance(100)
            raise RuntimeError("a failed step")

    with pytest.raises(RuntimeError, match="a failed step"):
        failed_step()
    assert armed == [600.0, 600.0, 600.0, 12.0]
    assert learned.snapshot() == {"step": LearnedScope(3, 6.0)}
