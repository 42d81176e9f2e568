"""The manual clock that the rest of the suite drives time with, the clocks' timers, and the
move_on_at deadline every shell stops waiting with."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioelastic._clock import (
    Clock,
    MonotonicClock,
    TimerClock,
    move_on_at,
    timer_clock,
    timer_context,
)
from aioelastic.testing import ManualClock
from tests.clocks import RecordingClock, ScopeOnlyClock

pytestmark = pytest.mark.anyio

VARIABLE: contextvars.ContextVar[str] = contextvars.ContextVar("VARIABLE")


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


@pytest.mark.parametrize("helper", [False, True], ids=["clock-scope", "move_on_at"])
async def test_scope_is_cancelled_only_when_time_reaches_its_deadline(
    manual: ManualLike, helper: bool
) -> None:
    """A block with a deadline of 5 (the clock's own scope, or move_on_at's timer) survives
    advancing to t=4 and is cancelled at t=5; its cancellation stops at the deadline, which
    says it ended the block, and no waiter is left on the clock."""
    entered = anyio.Event()
    outcome: list[bool] = []

    async def waiter() -> None:
        with move_on_at(manual, 5.0) if helper else manual.move_on_at(5.0) as scope:
            entered.set()
            await anyio.sleep_forever()
        outcome.append(scope.cancelled_caught)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await entered.wait()
        manual.advance(4.0)
        await anyio.wait_all_tasks_blocked()
        assert outcome == []
        manual.advance(1.0)
    assert outcome == [True]
    assert manual.sleepers == 0


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


# -- timers ---------------------------------------------------------------------------------


ManualLike = ManualClock | ScopeOnlyClock


@pytest.fixture(params=["manual", "scope-only"])
def manual(request: pytest.FixtureRequest) -> ManualLike:
    """A clock a test moves by hand: with timers, or a user's clock with move_on_at only."""
    return ManualClock() if request.param == "manual" else ScopeOnlyClock()


@pytest.fixture
def on_trio(anyio_backend: Any) -> bool:
    """Whether the test runs on trio."""
    return (anyio_backend[0] if isinstance(anyio_backend, tuple) else anyio_backend) == "trio"


@pytest.fixture
def asyncio_only(on_trio: bool) -> None:
    """Skips on trio: timers call back from an asyncio loop."""
    if on_trio:
        pytest.skip("clock timers call back from an asyncio loop")


def test_both_clocks_set_timers_and_a_scope_only_clock_does_not() -> None:
    """MonotonicClock and ManualClock are timer clocks; a clock with move_on_at alone is a
    Clock without timers, which the helpers fall back from."""
    assert isinstance(MonotonicClock(), TimerClock)
    assert isinstance(ManualClock(), TimerClock)
    scope_only = ScopeOnlyClock()
    assert isinstance(scope_only, Clock)
    assert not isinstance(scope_only, TimerClock)
    assert timer_clock(scope_only) is None


def test_manual_timers_run_when_time_reaches_their_deadline_in_order() -> None:
    """Each timer runs once, from the advance that reaches its deadline, earliest first."""
    clock = ManualClock()
    ran: list[str] = []
    clock.call_at(5.0, ran.append, "five")
    clock.call_at(3.0, ran.append, "three")
    clock.call_at(9.0, ran.append, "nine")
    clock.advance(2.9)
    assert ran == []
    clock.advance(2.1)
    assert ran == ["three", "five"]
    assert clock.sleepers == 1
    clock.advance(10.0)
    assert ran == ["three", "five", "nine"]
    assert clock.sleepers == 0


def test_a_cancelled_manual_timer_never_runs() -> None:
    """A timer cancelled before its deadline is forgotten; cancelling one that ran is a no-op."""
    clock = ManualClock()
    ran: list[str] = []
    early = clock.call_at(5.0, ran.append, "cancelled")
    late = clock.call_at(1.0, ran.append, "ran")
    early.cancel()
    assert clock.sleepers == 1
    clock.advance(10.0)
    late.cancel()
    assert ran == ["ran"]
    assert clock.sleepers == 0


async def test_a_manual_timer_already_due_runs_from_the_loop(asyncio_only: None) -> None:
    """A timer whose deadline was already reached runs soon, from the loop, never from within
    call_at; cancelled first, it does not run."""
    clock = ManualClock(start=10.0)
    ran: list[str] = []
    clock.call_at(3.0, ran.append, "due")
    clock.call_at(10.0, ran.append, "cancelled").cancel()
    assert ran == []
    await asyncio.sleep(0)
    assert ran == ["due"]


async def test_monotonic_timers_run_from_the_loop(asyncio_only: None) -> None:
    """MonotonicClock.call_at is the loop's timer: due now, it runs at the loop's next turn;
    cancelled first, it does not run."""
    clock = MonotonicClock()
    ran = anyio.Event()
    cancelled: list[str] = []
    clock.call_at(clock.now() - 1.0, cancelled.append, "cancelled").cancel()
    clock.call_at(clock.now(), ran.set)
    with anyio.fail_after(10):  # generous: the loop's next turn
        await ran.wait()
    assert cancelled == []


async def test_monotonic_timers_run_in_an_empty_context_of_their_thread(
    asyncio_only: None,
) -> None:
    """A timer's callback sees none of its caller's context variables (it needs none: it wakes
    or cancels what waits), and each thread has a context of its own for them, so loops in
    two threads never enter the same one at once."""
    clock = MonotonicClock()
    seen: list[object] = []
    ran = anyio.Event()
    token = VARIABLE.set("caller's")
    try:
        clock.call_at(clock.now(), lambda: (seen.append(VARIABLE.get("unset")), ran.set()))
    finally:
        VARIABLE.reset(token)
    with anyio.fail_after(10):  # generous: the loop's next turn
        await ran.wait()

    def in_another_thread() -> contextvars.Context:
        async def main() -> contextvars.Context:
            await asyncio.sleep(0)
            return timer_context()

        return asyncio.run(main())

    assert seen == ["unset"]
    assert await anyio.to_thread.run_sync(in_another_thread) is not timer_context()


# -- move_on_at -----------------------------------------------------------------------------


async def test_move_on_at_left_before_its_deadline_cancels_nothing(manual: ManualLike) -> None:
    """A block that ends first says the deadline did not end it, and leaves no timer: time
    passing the deadline later cancels nothing."""
    with move_on_at(manual, 5.0) as scope:
        await anyio.lowlevel.checkpoint()
    assert manual.sleepers == 0
    manual.advance(10.0)
    await anyio.lowlevel.checkpoint()  # raised here if a cancellation were still pending
    assert not scope.cancelled_caught


async def test_move_on_at_a_passed_deadline_stops_the_block_at_its_first_yield(
    manual: ManualLike,
) -> None:
    """A deadline already reached ends the block at its first checkpoint; a block that never
    yields to the loop runs to its end."""
    manual.advance(10.0)
    with move_on_at(manual, 3.0) as yielding:
        await anyio.lowlevel.checkpoint()
        pytest.fail("the block went on past its first checkpoint")  # pragma: no cover
    assert yielding.cancelled_caught
    ran = False
    with move_on_at(manual, 3.0) as quiet:
        ran = True
    await anyio.lowlevel.checkpoint()  # raised here if a cancellation were still pending
    assert ran
    assert not quiet.cancelled_caught
    assert manual.sleepers == 0


@pytest.mark.parametrize("outer_first", [None, True, False], ids=["alone", "first", "second"])
async def test_move_on_at_never_swallows_an_outer_cancellation(
    manual: ManualLike, outer_first: bool | None
) -> None:
    """A cancellation from outside ends the outer scope, also when it comes in the same turn as
    the block's deadline, either first or second: it goes through the block, or (an anyio
    scope's, after the deadline's) reaches the task at its next checkpoint, as anyio
    delivers it."""
    outer = anyio.CancelScope()

    async def waiter() -> None:
        with outer:
            with move_on_at(manual, 5.0):
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()
            pytest.fail("the outer cancellation was swallowed")  # pragma: no cover

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        if outer_first:
            outer.cancel()
        if outer_first is not None:
            manual.advance(5.0)
        if not outer_first:
            outer.cancel()
    assert outer.cancelled_caught
    assert manual.sleepers == 0


async def test_move_on_at_does_not_swallow_a_task_cancelled_natively(asyncio_only: None) -> None:
    """A task cancelled from outside (asyncio's own cancel) in the same turn as its block's
    deadline ends cancelled: the deadline swallows only its own cancellation."""
    clock = ManualClock()
    parked = asyncio.Event()

    async def waiter() -> None:
        with move_on_at(clock, 5.0):
            parked.set()
            await asyncio.sleep(3600)

    task = asyncio.get_running_loop().create_task(waiter())
    await parked.wait()
    clock.advance(5.0)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()


async def test_move_on_at_sets_a_timer_on_asyncio_and_a_scope_elsewhere(on_trio: bool) -> None:
    """On asyncio a timer clock's deadline is one timer (no anyio cancel scope); on trio it is
    the clock's own scope."""
    clock = RecordingClock()
    with move_on_at(clock, 5.0):
        await anyio.lowlevel.checkpoint()
    assert clock.used == (["scope"] if on_trio else ["timer"])


async def test_move_on_at_on_the_monotonic_clock() -> None:
    """On the loop's clock, a passed deadline ends the block at its first checkpoint and a
    distant one ends nothing."""
    clock = MonotonicClock()
    with move_on_at(clock, clock.now() - 1.0) as passed:
        await anyio.sleep_forever()
    with move_on_at(clock, clock.now() + 3600.0) as distant:
        await anyio.lowlevel.checkpoint()
    await anyio.lowlevel.checkpoint()  # raised here if a cancellation were still pending
    assert (passed.cancelled_caught, distant.cancelled_caught) == (True, False)
