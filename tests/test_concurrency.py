"""The concurrency helpers: the first-of race, exception-group unwrapping, light tasks."""

from __future__ import annotations

import gc
import weakref

import anyio
import pytest

from aioelastic._concurrency import LightTasks, first_of, lone_error, unwrap_single_error

pytestmark = pytest.mark.anyio


async def test_first_of_returns_the_first_result_and_cancels_the_rest() -> None:
    """The waiter that finishes first decides; the others are cancelled."""
    go = anyio.Event()
    cancelled: list[str] = []

    async def slow() -> str:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append("slow")
        raise AssertionError("unreachable")  # pragma: no cover

    async def fast() -> str:
        await go.wait()
        return "fast"

    async def start() -> str:
        go.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    assert await first_of(slow, fast, start) == "fast"
    assert cancelled == ["slow"]


async def test_first_of_raises_the_winners_error_as_itself() -> None:
    """A waiter that fails first makes first_of raise that error, not an exception group."""

    async def fails() -> int:
        raise LookupError("gone")

    with pytest.raises(LookupError, match="gone"):
        await first_of(anyio.sleep_forever, fails)


async def test_first_of_keeps_the_first_outcome_when_a_loser_fails_on_cancel() -> None:
    """An error a loser raises while it is cancelled does not replace the winner's result."""

    async def fails_when_cancelled() -> int:
        try:
            await anyio.sleep_forever()
        finally:
            raise RuntimeError("cleanup failed")

    async def wins() -> int:
        await anyio.lowlevel.checkpoint()
        return 7

    assert await first_of(fails_when_cancelled, wins) == 7


async def test_first_of_needs_a_waiter() -> None:
    """A race without runners is a misuse and says so."""
    with pytest.raises(ValueError, match="at least one waiter"):
        await first_of()


def test_lone_error_digs_through_groups_of_one() -> None:
    """Nested groups of one give their leaf; a group of two stays the group."""
    leaf = OSError(98, "in use")
    assert lone_error(ExceptionGroup("outer", [ExceptionGroup("inner", [leaf])])) is leaf
    pair = ExceptionGroup("two", [leaf, KeyError("k")])
    assert lone_error(pair) is pair
    assert lone_error(leaf) is leaf


async def fail_together(*errors: Exception) -> None:
    """Raise each of ``errors`` in a task of its own, in one task group, unwrapped."""

    async def fails(error: Exception) -> None:
        raise error

    with unwrap_single_error():
        async with anyio.create_task_group() as tg:
            for error in errors:
                tg.start_soon(fails, error)


async def test_unwrap_raises_a_task_groups_lone_error_with_its_own_cause() -> None:
    """A lone error leaves the task group as itself, keeping the cause it was raised with."""
    error = KeyError("k")
    error.__cause__ = ValueError("why")
    with pytest.raises(KeyError) as caught:
        await fail_together(error)
    assert caught.value is error
    assert isinstance(caught.value.__cause__, ValueError)


async def test_unwrap_leaves_several_errors_as_a_group() -> None:
    """Two errors at once are both kept: the group passes through unchanged."""
    with pytest.raises(ExceptionGroup) as caught:
        await fail_together(KeyError("a"), LookupError("b"))
    assert len(caught.value.exceptions) == 2


async def test_the_winners_error_is_freed_once_handled_without_the_collector() -> None:
    """first_of keeps no reference cycle to the error it raised: it dies by refcount."""

    class Boom(Exception):
        pass

    async def fail() -> None:
        raise Boom

    async def wait() -> None:
        await anyio.sleep_forever()

    gc.collect()
    gc.disable()
    try:
        try:
            await first_of(fail, wait)
        except Boom as error:
            raised = weakref.ref(error)
        assert raised() is None
    finally:
        gc.enable()


async def test_light_tasks_are_cancelled_by_their_handle_and_closed_by_their_owner() -> None:
    """A light task ends when its cancel is called; aclose cancels the rest and waits."""
    ended: list[str] = []

    async def wait_forever(name: str) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            ended.append(name)

    async with anyio.create_task_group() as tg:
        tasks = LightTasks(tg)
        stop_first = tasks.start(wait_forever, "first")
        tasks.start(wait_forever, "second")
        await anyio.wait_all_tasks_blocked()
        stop_first()
        await anyio.wait_all_tasks_blocked()
        assert ended == ["first"]
        await tasks.aclose()
        await anyio.wait_all_tasks_blocked()  # on trio the group, not aclose, waits
        assert ended == ["first", "second"]
        stop_first()  # a no-op once it has ended


async def test_a_light_tasks_error_is_raised_in_its_task_group() -> None:
    """An error in a light task fails the owner's task group, as one of its own tasks'."""

    async def fail() -> None:
        await anyio.lowlevel.checkpoint()
        raise ValueError("boom")

    async def run() -> None:
        with unwrap_single_error():
            async with anyio.create_task_group() as tg:
                LightTasks(tg).start(fail)
                await anyio.sleep_forever()

    with pytest.raises(ValueError, match="boom"):
        await run()
