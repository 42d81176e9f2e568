"""Elastic rendezvous over one MemoryStore: many handlers in one loop, time on a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest
from anyio.abc import TaskGroup

from aioelastic.rendezvous import (
    InvalidationReason,
    NodeLost,
    RendezvousClosedError,
    RendezvousEvent,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeoutError,
    RoundCompleted,
    RoundJoining,
)
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import MemoryStore
from aioelastic.testing import FaultyStore, ManualClock
from tests.rendezvous.conftest import MakeHandler, advance, hang

pytestmark = pytest.mark.anyio


class Joiner:
    """Runs ``next_rendezvous`` of one handler in the background and keeps its outcome."""

    def __init__(self, handler: ElasticRendezvousHandler) -> None:
        self.handler = handler
        self.info: RendezvousInfo | None = None
        self.error: BaseException | None = None
        self.done = anyio.Event()
        self.scope = anyio.CancelScope()

    async def run(self) -> None:
        with self.scope:
            try:
                self.info = await self.handler.next_rendezvous()
            except Exception as error:
                self.error = error
            finally:
                self.done.set()


@asynccontextmanager
async def cluster(handlers: list[ElasticRendezvousHandler]) -> AsyncIterator[TaskGroup]:
    """Enter every handler, then yield a task group for their joins (nested properly)."""
    async with AsyncExitStack() as stack:
        for handler in handlers:
            await stack.enter_async_context(handler)
        async with anyio.create_task_group() as tg:
            yield tg
            tg.cancel_scope.cancel()


def start(tg: TaskGroup, handlers: list[ElasticRendezvousHandler]) -> list[Joiner]:
    joiners = [Joiner(h) for h in handlers]
    for joiner in joiners:
        tg.start_soon(joiner.run)
    return joiners


async def finished(joiners: list[Joiner]) -> list[RendezvousInfo]:
    with anyio.fail_after(10):  # generous: only guards against a hang
        for joiner in joiners:
            await joiner.done.wait()
    infos = [j.info for j in joiners]
    assert all(info is not None for info in infos), [j.error for j in joiners]
    return [info for info in infos if info is not None]


async def test_a_round_completes_at_once_when_max_nodes_join(make_handler: MakeHandler) -> None:
    """max_nodes joiners complete without any time passing, with ranks 0..n-1."""
    handlers = [make_handler(min_nodes=2, max_nodes=3) for _ in range(3)]
    async with cluster(handlers) as tg:
        infos = await finished(start(tg, handlers))
    assert sorted(info.rank for info in infos) == [0, 1, 2]
    assert {info.world_size for info in infos} == {3}
    assert len({info.bootstrap_store_info for info in infos}) == 1


async def test_min_nodes_complete_after_the_last_call(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """With min_nodes joined the round waits last_call_timeout, then completes."""
    handlers = [make_handler(min_nodes=2, max_nodes=4) for _ in range(2)]
    async with cluster(handlers) as tg:
        joiners = start(tg, handlers)
        await advance(clock, 9.5, step=0.5)
        assert not any(j.done.is_set() for j in joiners)
        await advance(clock, 0.5)
        infos = await finished(joiners)
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_too_few_nodes_time_out_with_the_counts(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """Below min_nodes until join_timeout: RendezvousTimeoutError naming the counts."""
    handler = make_handler(min_nodes=2, max_nodes=3, join_timeout=30)
    async with handler, anyio.create_task_group() as tg:
        (joiner,) = start(tg, [handler])
        await advance(clock, 30, step=5)
        await joiner.done.wait()
    assert isinstance(joiner.error, RendezvousTimeoutError)
    with pytest.raises(
        RendezvousTimeoutError, match=r"30 s with 1 live node\(s\) joined, 2 needed"
    ):
        raise joiner.error


async def test_timeout_is_an_alias_of_join_timeout(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """The ``timeout`` key (torchrun passes it) sets the join timeout."""
    handler = make_handler(min_nodes=2, max_nodes=2, join_timeout=None, timeout="7")
    assert handler.settings.join_timeout == 7.0


async def test_a_late_node_waits_and_invalidates_the_round(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """A node arriving after completion waits, is counted, and the members learn at once."""
    members = [make_handler(min_nodes=2, max_nodes=3) for _ in range(2)]
    late = make_handler(min_nodes=2, max_nodes=3)
    async with cluster([*members, late]) as tg:
        first = start(tg, members)
        await advance(clock, 10)
        before = {
            j.handler.node_id: info.rank
            for j, info in zip(first, await finished(first), strict=True)
        }
        assert await members[0].num_nodes_waiting() == 0
        (waiting,) = start(tg, [late])
        verdicts = [await member.wait_round_invalidated() for member in members]
        assert {v.reason for v in verdicts} == {InvalidationReason.NODES_WAITING}
        assert await members[0].num_nodes_waiting() == 1
        assert not waiting.done.is_set()
        again = start(tg, members)  # the members re-join: max_nodes now, so it completes
        infos = await finished([*again, waiting])
    assert {info.world_size for info in infos} == {3}
    for joiner, info in zip(again, infos, strict=False):
        assert info.rank == before[joiner.handler.node_id]


async def test_a_lost_participant_invalidates_the_survivors_round(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """A member whose liveness key expires makes the others' round invalid."""
    handlers = [make_handler(min_nodes=2, max_nodes=3) for _ in range(3)]
    async with cluster(handlers) as tg:
        await finished(start(tg, handlers))
        victim = handlers[1]
        hang(victim)
        await advance(clock, 16)
        with anyio.fail_after(10):
            verdicts = [await h.wait_round_invalidated() for h in (handlers[0], handlers[2])]
    assert {v.reason for v in verdicts} == {InvalidationReason.PARTICIPANT_LOST}
    assert f"node(s) {victim.node_id} " in verdicts[0].detail


async def test_a_member_that_shuts_down_invalidates_without_closing(
    make_handler: MakeHandler,
) -> None:
    """shutdown() leaves: the others see a lost participant, the run stays open."""
    handlers = [make_handler(min_nodes=2, max_nodes=3) for _ in range(3)]
    async with cluster(handlers) as tg:
        await finished(start(tg, handlers))
        assert await handlers[2].shutdown()
        verdict = await handlers[0].wait_round_invalidated()
        assert verdict.reason is InvalidationReason.PARTICIPANT_LOST
        assert not await handlers[0].is_closed()
        with pytest.raises(RendezvousStateError, match="shut down"):
            await handlers[2].next_rendezvous()


async def test_set_closed_tells_members_and_fails_later_joins(make_handler: MakeHandler) -> None:
    """After set_closed the members learn CLOSED at once, and any later join raises closed."""
    handlers = [make_handler(min_nodes=2, max_nodes=2) for _ in range(3)]
    async with cluster(handlers) as tg:
        await finished(start(tg, handlers[:2]))
        await handlers[0].set_closed()
        verdict = await handlers[1].wait_round_invalidated()
        assert verdict.reason is InvalidationReason.CLOSED
        assert await handlers[2].is_closed()
        for handler in handlers[1:]:
            with pytest.raises(RendezvousClosedError, match="run 'job' is closed"):
                await handler.next_rendezvous()


async def test_set_closed_fails_a_waiting_join(make_handler: MakeHandler) -> None:
    """A node waiting for a round gets RendezvousClosedError when the run closes."""
    waiting_handler, closer = make_handler(), make_handler()
    async with cluster([waiting_handler, closer]) as tg:
        (waiting,) = start(tg, [waiting_handler])
        await anyio.wait_all_tasks_blocked()
        await closer.set_closed()
        await waiting.done.wait()
    assert isinstance(waiting.error, RendezvousClosedError)


async def test_cancelling_a_join_withdraws_it(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """A cancelled next_rendezvous removes its join record: nobody counts it."""
    handlers = [make_handler(min_nodes=2, max_nodes=2) for _ in range(3)]
    async with cluster(handlers) as tg:
        await finished(start(tg, handlers[:2]))
        (waiting,) = start(tg, handlers[2:])
        await anyio.wait_all_tasks_blocked()
        assert await handlers[0].num_nodes_waiting() == 1
        waiting.scope.cancel()
        await waiting.done.wait()
        assert await handlers[0].num_nodes_waiting() == 0


async def test_invalidation_needs_a_completed_round(make_handler: MakeHandler) -> None:
    """wait_round_invalidated before any round is a usage error."""
    async with make_handler() as handler:
        with pytest.raises(RendezvousStateError, match="call next_rendezvous"):
            await handler.wait_round_invalidated()


async def test_a_handler_must_be_entered(make_handler: MakeHandler) -> None:
    """Calling a handler outside `async with` says how to use it."""
    with pytest.raises(RendezvousStateError, match="async with handler"):
        await make_handler().next_rendezvous()


@pytest.mark.parametrize("nodes", [4, 32])
async def test_a_round_costs_a_constant_number_of_store_operations_per_node(
    store: MemoryStore, clock: ManualClock, nodes: int
) -> None:
    """O(N) per round: at most 8 store operations per node, whatever N (monitor included)."""
    from bench.rendezvous import CountingStore

    counting = CountingStore(store)
    settings = ElasticSettings("job", nodes, nodes)
    handlers = [
        ElasticRendezvousHandler(counting, settings, backend="memory", clock=clock)
        for _ in range(nodes)
    ]
    async with cluster(handlers) as tg:
        counting.counts.clear()
        await finished(start(tg, handlers))
        await anyio.wait_all_tasks_blocked()  # the round monitors have started too
        assert sum(counting.counts.values()) <= 8 * nodes
        assert counting.counts["get_prefix"] <= 2 * nodes + 2


async def test_events_and_statistics_tell_the_story_of_a_round(
    make_handler: MakeHandler, clock: ManualClock
) -> None:
    """Joining, completion, a reported loss and the invalidation arrive as typed events."""
    handlers = [make_handler(min_nodes=2, max_nodes=2) for _ in range(2)]
    events: dict[int, list[RendezvousEvent]] = {0: [], 1: []}
    for index, handler in enumerate(handlers):
        handler.subscribe(events[index].append)
    async with cluster(handlers) as tg:
        await finished(start(tg, handlers))
        watcher, victim = handlers
        stats = watcher.statistics()
        assert (stats.round, stats.world_size, stats.rounds_completed) == (1, 2, 1)
        assert stats.invalidated is None
        hang(victim)
        await advance(clock, 16)
        verdict = await watcher.wait_round_invalidated()
    node, lost = watcher.node_id, victim.node_id
    assert events[0] == [
        RoundJoining("job", node),
        RoundCompleted("job", 1, node, watcher.statistics().rank, 2),
        NodeLost("job", 1, lost),
        verdict,
    ]
    assert watcher.statistics().invalidated == verdict


def faulty_nodes(
    store: MemoryStore, clock: ManualClock, count: int, max_nodes: int
) -> tuple[list[FaultyStore], list[ElasticRendezvousHandler]]:
    """``count`` handlers of run ``job``, each seeing ``store`` through a FaultyStore of its own."""
    settings = ElasticSettings(
        "job", 2, max_nodes, last_call_timeout=10, keep_alive_interval=5, heartbeat_timeout=15
    )
    views = [FaultyStore(store, name=f"node{index}") for index in range(count)]
    handlers = [
        ElasticRendezvousHandler(view, settings, backend="memory", clock=clock) for view in views
    ]
    return views, handlers


async def watcher_and_victim(
    joiners: list[Joiner],
) -> tuple[ElasticRendezvousHandler, ElasticRendezvousHandler]:
    """Once the round formed: rank 0, which watches rank 1's liveness, and rank 1."""
    infos = await finished(joiners)
    ranks = {info.rank: j.handler for j, info in zip(joiners, infos, strict=True)}
    return ranks[0], ranks[1]


async def test_the_watcher_reports_its_lost_successor_even_if_the_round_ends_meanwhile(
    store: MemoryStore, clock: ManualClock
) -> None:
    """The node that finds its ring successor gone emits NodeLost even when the round ends
    for another reason while it is still writing its report (a late node joined): the agent's
    in-place recovery learns the loss from that event, not from the next round."""
    views, handlers = faulty_nodes(store, clock, 4, max_nodes=4)
    events: list[RendezvousEvent] = []
    async with cluster(handlers) as tg:
        first = start(tg, handlers[:3])
        await advance(clock, 10)  # the last call
        watcher, victim = await watcher_and_victim(first)
        watcher.subscribe(events.append)
        stall = views[handlers.index(watcher)].stall("add")  # its report's doorbell
        hang(victim)
        await advance(clock, 16)
        await stall.wait_held()
        start(tg, handlers[3:])  # a late node: the round ends while the report is held
        await watcher.wait_round_invalidated()
        stall.release()
        await anyio.wait_all_tasks_blocked()
    assert NodeLost("job", 1, victim.node_id) in events


async def test_a_failed_loss_report_is_tried_again_and_the_loss_told_once(
    store: MemoryStore, clock: ManualClock
) -> None:
    """The watcher's report of its lost successor fails (cut off mid-report): it writes the
    report again once the store is back, and NodeLost is emitted once, not once a try."""
    views, handlers = faulty_nodes(store, clock, 3, max_nodes=3)
    events: list[RendezvousEvent] = []
    async with cluster(handlers) as tg:
        watcher, victim = await watcher_and_victim(start(tg, handlers))
        watcher.subscribe(events.append)
        view = views[handlers.index(watcher)]
        stall = view.stall("add")
        hang(victim)
        await advance(clock, 16)
        await stall.wait_held()
        view.partition()  # the held add fails
        await anyio.wait_all_tasks_blocked()
        view.heal()
        stall.release()
        await advance(clock, 5)  # the watch's pause before it tries again
        verdict = await watcher.wait_round_invalidated()
    assert verdict.reason is InvalidationReason.PARTICIPANT_LOST
    assert events.count(NodeLost("job", 1, victim.node_id)) == 1


async def test_serve_runs_the_handler_in_the_callers_task_group(
    make_handler: MakeHandler,
) -> None:
    """``await tg.start(handler.serve)`` connects; cancelling the task leaves the run."""
    first, second = make_handler(min_nodes=2, max_nodes=2), make_handler(min_nodes=2, max_nodes=2)
    async with anyio.create_task_group() as tg:
        await tg.start(first.serve)
        await tg.start(second.serve)
        infos = await finished(start(tg, [first, second]))
        assert sorted(info.rank for info in infos) == [0, 1]
        tg.cancel_scope.cancel()
    with pytest.raises(RendezvousStateError, match="shut down"):
        await first.next_rendezvous()


async def test_one_join_at_a_time_per_handler(make_handler: MakeHandler) -> None:
    """A second concurrent next_rendezvous on one handler is a usage error."""
    handler = make_handler()
    async with cluster([handler]) as tg:
        start(tg, [handler])
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(RendezvousStateError, match="already running on this handler"):
            await handler.next_rendezvous()
