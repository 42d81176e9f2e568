"""Flat combining of concurrent adds (no etcd needed: the write is a function here)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from aioelastic.store._etcd_combine import AddCombiner


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio"), pytest.param("trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


pytestmark = pytest.mark.anyio


class Counter:
    """A stored integer whose writes can be held open by the test."""

    def __init__(self) -> None:
        self.value = 0
        self.writes: list[int] = []
        self.release = anyio.Event()
        self.writing = anyio.Event()

    async def apply(self, total: int) -> int:
        self.writes.append(total)
        self.writing.set()
        await self.release.wait()
        self.value += total
        return self.value


def unknown() -> BaseException:
    return RuntimeError("outcome unknown")


async def test_concurrent_adds_share_writes_and_see_sequential_totals() -> None:
    """Adds queued while a write is in flight go out together; each gets its own total."""
    combiner, counter = AddCombiner(), Counter()
    results: dict[int, int] = {}
    order: list[int] = []  # the queue order (the scheduler may start tasks in any order)

    async def add(i: int) -> None:
        order.append(i)
        results[i] = await combiner.add(i, counter.apply, unknown)

    async with anyio.create_task_group() as tg:
        tg.start_soon(add, 1)
        await counter.writing.wait()
        for i in range(2, 6):
            tg.start_soon(add, i)
        await anyio.wait_all_tasks_blocked()
        counter.release.set()
    assert counter.writes == [1, 2 + 3 + 4 + 5]
    running, expected = 0, {}
    for i in order:
        running += i
        expected[i] = running
    assert results == expected
    assert combiner.users == 0


async def test_a_failed_write_fails_every_add_in_its_batch() -> None:
    """The error of a combined write reaches each caller whose amount it carried."""
    combiner = AddCombiner()

    async def failing(total: int) -> int:
        raise ValueError(f"cannot add {total}")

    errors: list[str] = []

    async def add() -> None:
        with pytest.raises(ValueError, match="cannot add") as caught:
            await combiner.add(1, failing, unknown)
        errors.append(str(caught.value))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(add)
    assert len(errors) == 3


async def test_cancelling_the_writer_reports_an_unknown_outcome_to_the_others() -> None:
    """If the caller writing a batch is cancelled, the others in that batch learn that the
    outcome is unknown (their add is neither dropped silently nor re-sent)."""
    combiner, counter = AddCombiner(), Counter()
    scopes = {name: anyio.CancelScope() for name in ("a", "b")}
    writer: list[str] = []
    outcomes: dict[str, str] = {}

    async def add(name: str) -> None:
        async def apply(total: int) -> int:
            writer.append(name)
            return await counter.apply(total)

        with scopes[name]:
            try:
                await combiner.add(1, apply, unknown)
                outcomes[name] = "added"
            except RuntimeError as error:
                outcomes[name] = str(error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(add, "a")
        tg.start_soon(add, "b")
        await counter.writing.wait()
        scopes[writer[0]].cancel()
    (other,) = set(scopes) - set(writer)
    assert counter.writes == [2]
    assert outcomes == {other: "outcome unknown"}
    assert combiner.users == 0
