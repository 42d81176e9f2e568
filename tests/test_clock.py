"""The manual clock that the rest of the suite drives time with."""

import anyio
import pytest

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
