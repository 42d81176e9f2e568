"""Combined adds and shared calls (no etcd needed: the store call is a function here)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from aioelastic.store._etcd_combine import AddCombiner, CountedWrite, CountedWrites, SharedCalls


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


async def test_an_add_cancelled_while_queued_is_never_applied() -> None:
    """A caller cancelled while its add waits behind a write in flight leaves the queue: the
    next batch carries only the adds whose callers still wait for them."""
    combiner, counter = AddCombiner(), Counter()
    results: dict[str, int] = {}
    queued = anyio.CancelScope()

    async def add(name: str, amount: int, scope: anyio.CancelScope | None = None) -> None:
        with scope or anyio.CancelScope():
            results[name] = await combiner.add(amount, counter.apply, unknown)

    async with anyio.create_task_group() as tg:
        tg.start_soon(add, "first", 1)
        await counter.writing.wait()
        tg.start_soon(add, "cancelled", 10, queued)
        tg.start_soon(add, "kept", 100)
        await anyio.wait_all_tasks_blocked()
        queued.cancel()
        await anyio.wait_all_tasks_blocked()
        counter.release.set()
    assert counter.writes == [1, 100]
    assert results == {"first": 1, "kept": 101}
    assert combiner.users == 0


class Source:
    """A call that the test completes by hand, counting how often it runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = anyio.Event()
        self.finish = anyio.Event()
        self.cancelled = False

    async def run(self) -> int:
        self.runs += 1
        self.started.set()
        try:
            await self.finish.wait()
        except BaseException:
            self.cancelled = True
            raise
        return self.runs


def shared(join_running: bool) -> SharedCalls[str, int]:
    return SharedCalls(join_running=join_running, closed=lambda: RuntimeError("closed"))


async def test_concurrent_calls_share_one_execution() -> None:
    """Calls with one key made before the execution starts all get its single result."""
    calls, source = shared(join_running=False), Source()
    results: list[int] = []
    async with anyio.create_task_group() as flights, anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(lambda: _append(results, calls.call(flights, "k", source.run)))
        await source.started.wait()
        source.finish.set()
    assert (source.runs, results) == (1, [1] * 5)


async def _append(results: list[int], call: Any) -> None:
    results.append(await call)


@pytest.mark.parametrize(
    ("join_running", "runs"),
    [pytest.param(False, 2, id="read-starts-its-own"), pytest.param(True, 1, id="watch-joins")],
)
async def test_a_call_made_while_one_runs_joins_it_only_if_allowed(
    join_running: bool, runs: int
) -> None:
    """A read in flight is not joined (it could return a value older than the new call); a
    watch in flight is (its answer does not depend on when it began)."""
    calls, source = shared(join_running), Source()
    results: list[int] = []
    async with anyio.create_task_group() as flights, anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(results, calls.call(flights, "k", source.run)))
        await source.started.wait()
        tg.start_soon(lambda: _append(results, calls.call(flights, "k", source.run)))
        await anyio.wait_all_tasks_blocked()
        source.finish.set()
    assert source.runs == runs
    assert len(results) == 2


async def test_one_caller_leaving_does_not_disturb_the_others() -> None:
    """A cancelled caller detaches; the shared execution goes on for the rest."""
    calls, source = shared(join_running=True), Source()
    results: list[int] = []
    async with anyio.create_task_group() as flights, anyio.create_task_group() as tg:
        with anyio.CancelScope() as leaver:
            tg.start_soon(lambda: _append(results, calls.call(flights, "k", source.run)))
            await source.started.wait()
            leaver.cancel()
            await calls.call(flights, "k", source.run)
        tg.start_soon(lambda: _append(results, calls.call(flights, "k", source.run)))
        await anyio.wait_all_tasks_blocked()
        source.finish.set()
    assert (source.runs, source.cancelled, results) == (1, False, [1, 1])


async def test_a_watch_every_caller_left_is_stopped() -> None:
    """When the last caller of a watch leaves, the watch is cancelled and forgotten."""
    calls, source = shared(join_running=True), Source()
    async with anyio.create_task_group() as flights, anyio.create_task_group() as tg:
        caller = anyio.CancelScope()

        async def call() -> None:
            with caller:
                await calls.call(flights, "k", source.run)

        tg.start_soon(call)
        await source.started.wait()
        caller.cancel()
        await anyio.wait_all_tasks_blocked()
    assert (len(calls), source.cancelled) == (0, True)


async def test_an_error_reaches_every_caller() -> None:
    """An exception of the shared execution is raised in each caller."""
    calls = shared(join_running=False)

    async def fail() -> int:
        raise ValueError("etcd said no")

    async def call() -> None:
        with pytest.raises(ValueError, match="etcd said no"):
            await calls.call(flights, "k", fail)

    async with anyio.create_task_group() as flights, anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(call)


class KeyCounter:
    """Keys counted as they are written, batch by batch; the test can hold a batch open."""

    def __init__(self) -> None:
        self.keys: set[bytes] = set()
        self.batches: list[list[dict[bytes, bytes]]] = []
        self.release = anyio.Event()
        self.sending = anyio.Event()

    async def send(self, batch: list[CountedWrite]) -> list[int]:
        self.batches.append([entry.puts for entry in batch])
        self.sending.set()
        await self.release.wait()
        counts = []
        for entry in batch:
            self.keys.update(entry.puts)
            counts.append(len({key for key in self.keys if key.startswith(b"join/")}))
        return counts


async def test_counted_writes_queued_together_go_in_one_batch_with_distinct_counts() -> None:
    """Writes queued behind a batch in flight go in the next batch together, each with its
    own count; a key two writes give the same value does not split them."""
    store, writes, counts = KeyCounter(), CountedWrites(limit=100), []

    async def write(node: int) -> None:
        puts = {f"join/{node}".encode(): b"r", b"bell": b"0"}
        counts.append(await writes.write(puts, store.send))

    async with anyio.create_task_group() as tg:
        tg.start_soon(write, 0)
        await store.sending.wait()
        for node in range(1, 6):
            tg.start_soon(write, node)
        await anyio.wait_all_tasks_blocked()
        store.release.set()
    assert sorted(counts) == [1, 2, 3, 4, 5, 6]
    assert [len(batch) for batch in store.batches] == [1, 5]


async def test_a_batch_splits_at_its_limit_and_at_a_key_written_two_ways() -> None:
    """A batch holds at most ``limit`` operations, and never one key with two values."""
    store, writes = KeyCounter(), CountedWrites(limit=5)
    store.release.set()
    puts = [
        {b"join/1": b"a", b"bell": b"0"},
        {b"join/2": b"a", b"bell": b"1"},  # bell written two ways: not with the first
        {b"join/3": b"a", b"bell": b"0"},
        {b"join/4": b"a", b"bell": b"0"},  # 2 + 1 + 1 + 1 + 1 + 1 > 5: the next batch
    ]
    async with anyio.create_task_group() as tg:
        blocker = anyio.Event()
        tg.start_soon(writes.write, {b"join/0": b"a"}, lambda batch: _held(blocker, batch))
        await anyio.wait_all_tasks_blocked()
        for each in puts:  # queued in this order (trio starts tasks in any order)
            tg.start_soon(writes.write, each, store.send)
            await anyio.wait_all_tasks_blocked()
        blocker.set()
    assert [[sorted(p) for p in batch] for batch in store.batches] == [
        [[b"bell", b"join/1"], [b"bell", b"join/3"]],
        [[b"bell", b"join/2"]],
        [[b"bell", b"join/4"]],
    ]


async def _held(release: anyio.Event, batch: list[CountedWrite]) -> list[int]:
    await release.wait()
    return [1] * len(batch)


async def test_a_batch_writer_cancelled_leaves_the_others_to_be_sent_again() -> None:
    """The caller sending a batch is cancelled: the batch's other writes are sent again by
    the next caller, and the cancelled one's is not."""
    store, writes, counts = KeyCounter(), CountedWrites(limit=100), []
    first = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_write_in, first, writes, store, b"join/0")
        # the first writer holds the lock and sends join/0; queue join/1 behind it
        await store.sending.wait()

        async def second() -> None:
            counts.append(await writes.write({b"join/1": b"r"}, store.send))

        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        first.cancel()
        await anyio.wait_all_tasks_blocked()
        store.release.set()
    assert counts == [1]
    assert store.keys == {b"join/1"}


async def _write_in(
    scope: anyio.CancelScope, writes: CountedWrites, store: KeyCounter, key: bytes
) -> None:
    with scope:
        await writes.write({key: b"r"}, store.send)
