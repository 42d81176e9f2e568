"""The manual clock that the rest of the suite drives time with."""

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioelastic._clock import MonotonicClock
from aioelastic.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_sleeper_wakes_only_when_time_reaches_its_deadline() -> None:
    """A task sleeping until t=5 stays asleep at t=4 and wakes at t=5."""
    clock = ManualClock()
    woke = anyio.Event()

    async def sleeper() -> None:
        await clock.sleep_until(5.0)
        woke.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        await anyio.wait_all_tasks_blocked()
        clock.advance(4.0)
        await anyio.wait_all_tasks_blocked()
        assert not woke.is_set()
        clock.advance(1.0)
        await woke.wait()
    assert clock.now() == 5.0


async def test_sleep_until_the_past_returns_at_once() -> None:
    """A deadline already reached does not register a sleeper."""
    clock = ManualClock(start=10.0)
    await clock.sleep_until(3.0)
    assert clock.sleepers == 0


def test_clock_refuses_to_go_backwards() -> None:
    """Advancing by a negative amount is a misuse and says so."""
    with pytest.raises(ValueError, match="cannot go backwards"):
        ManualClock().advance(-1)


async def test_scope_is_cancelled_only_when_time_reaches_its_deadline() -> None:
    """A move_on_at(5) block survives advancing to t=4 and is cancelled at t=5."""
    clock = ManualClock()
    entered = anyio.Event()
    outcome: list[bool] = []

    async def waiter() -> None:
        with clock.move_on_at(5.0) as scope:
            entered.set()
            await anyio.sleep_forever()
        outcome.append(scope.cancelled_caught)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await entered.wait()
        clock.advance(4.0)
        await anyio.wait_all_tasks_blocked()
        assert outcome == []
        clock.advance(1.0)
    assert outcome == [True]


async def test_scope_at_a_past_deadline_cancels_at_once() -> None:
    """A deadline already reached cancels the block at its first checkpoint."""
    clock = ManualClock(start=10.0)
    with clock.move_on_at(3.0) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert clock.sleepers == 0


async def test_scope_left_before_its_deadline_is_forgotten() -> None:
    """A block that ends before its deadline leaves no waiter behind, and a later advance
    past that deadline cancels nothing."""
    clock = ManualClock()
    with clock.move_on_at(5.0) as scope:
        assert clock.sleepers == 1
    assert clock.sleepers == 0
    clock.advance(10.0)
    assert not scope.cancel_called


async def test_cancelled_sleeper_is_forgotten() -> None:
    """A task cancelled in sleep_until no longer counts as a sleeper."""
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.sleep_until, 5.0)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 1
        tg.cancel_scope.cancel()
    assert clock.sleepers == 0


async def test_monotonic_clock_scope_uses_the_loops_deadline() -> None:
    """MonotonicClock.move_on_at is anyio's own deadline: one already passed cancels at once."""
    clock = MonotonicClock()
    with clock.move_on_at(clock.now() - 1.0) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert scope.deadline == pytest.approx(clock.now() - 1.0, abs=1.0)


@settings(max_examples=60)
@given(
    deadlines=st.lists(st.floats(0.0, 20.0), max_size=8),
    leave_early=st.lists(st.booleans(), min_size=8, max_size=8),
    steps=st.lists(st.floats(0.0, 6.0), min_size=1, max_size=6),
)
def test_waiters_wake_exactly_when_their_deadline_is_reached(
    deadlines: list[float], leave_early: list[bool], steps: list[float]
) -> None:
    """After each advance, the sleepers and scopes woken are those whose deadline is reached;
    waiters that left early are forgotten and never woken."""

    async def check() -> None:
        clock = ManualClock()
        woken: set[int] = set()
        leave = [anyio.Event() for _ in deadlines]

        async def sleeper(index: int, deadline: float) -> None:
            async with anyio.create_task_group() as race:

                async def early() -> None:
                    await leave[index].wait()
                    race.cancel_scope.cancel()

                race.start_soon(early)
                if index % 2:
                    await clock.sleep_until(deadline)
                else:
                    with clock.move_on_at(deadline):
                        await anyio.sleep_forever()
                woken.add(index)
                race.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for index, deadline in enumerate(deadlines):
                tg.start_soon(sleeper, index, deadline)
            await anyio.wait_all_tasks_blocked()
            gone: set[int] = set()
            for index in range(len(deadlines)):
                if leave_early[index] and deadlines[index] > clock.now():
                    leave[index].set()
                    gone.add(index)
            await anyio.wait_all_tasks_blocked()
            for step in steps:
                clock.advance(step)
                await anyio.wait_all_tasks_blocked()
                due = {i for i, d in enumerate(deadlines) if d <= clock.now()}
                assert woken == due - gone
                assert clock.sleepers == len(deadlines) - len(due | gone)
            tg.cancel_scope.cancel()

    anyio.run(check, backend="trio")  # trio knows exactly when every task is blocked
