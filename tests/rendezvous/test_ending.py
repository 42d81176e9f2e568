"""A clean ending: the store's host leaves only once every participant read the end, and a
participant whose store server is gone is told so at once (one MemoryStore, a manual clock)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from aioelastic.rendezvous import InvalidationReason, RendezvousClosedError
from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._ending import Hosting, unsettled
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import MemoryStore, Store
from aioelastic.testing import FaultyStore, ManualClock
from tests.rendezvous.conftest import advance, hang

pytestmark = pytest.mark.anyio

SETTINGS = ElasticSettings(
    "job", 3, 3, last_call_timeout=10, keep_alive_interval=5, heartbeat_timeout=15
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def handler(
    store: Store, clock: ManualClock, hosting: Hosting | None = None
) -> ElasticRendezvousHandler:
    return ElasticRendezvousHandler(
        store, SETTINGS, backend="c10d", local_addr="127.0.0.1", clock=clock, hosting=hosting
    )


@asynccontextmanager
async def round_of_three(
    host: ElasticRendezvousHandler, *others: ElasticRendezvousHandler
) -> AsyncIterator[None]:
    """Enter the handlers (the host first, so it leaves last) and complete a round of three."""
    async with AsyncExitStack() as stack:
        for each in (host, *others):
            await stack.enter_async_context(each)
        async with anyio.create_task_group() as tg:
            for each in (host, *others):
                tg.start_soon(each.next_rendezvous)
        yield


class Leaving:
    """The host's ``shutdown()`` in the background, and whether it returned."""

    def __init__(self, host: ElasticRendezvousHandler) -> None:
        self.host = host
        self.left = anyio.Event()

    async def run(self) -> None:
        await self.host.shutdown()
        self.left.set()


def test_a_participant_settles_by_reading_the_close_leaving_or_dying() -> None:
    """Who the host still waits for: members (and joiners) whose liveness key is there and
    that did not say they read the close; never itself."""
    head = layout.round_prefix(2)
    closed = {head + "result": layout.CLOSED_RESULT}
    alive = frozenset({1, 2, 3, 4, 5})
    assert unsettled((1, 2, 3), closed, 2, alive, host=1) == {2, 3}
    read = {**closed, layout.seen_key(2, 2): b"1", layout.lost_key(2, 3): b"left"}
    assert unsettled((1, 2, 3), read, 2, alive, host=1) == {3}  # leaving: its key is still there
    assert unsettled((1, 2, 3), read, 2, alive - {3}, host=1) == frozenset()  # left
    assert unsettled((1, 2, 3), closed, 2, frozenset({1}), host=1) == frozenset()  # gone
    joined = {**closed, layout.join_key(2, 4): b"{}"}
    assert unsettled((1,), joined, 2, alive, host=1) == {4}  # a joiner must read it too
    moved_on = {layout.join_key(2, 2): b"{}"}  # not closed: it joined the next round
    assert unsettled((1, 2), moved_on, 2, alive, host=1) == frozenset()


async def test_the_host_leaves_only_after_a_member_read_the_close() -> None:
    """The host closes and leaves while a member's read of its inbox is held: the host's
    leaving waits until that member read CLOSED (on the old code it left at once)."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    slow_store = FaultyStore(store, name="slow")
    host = handler(store, clock, Hosting(here=True))
    fast, slow = handler(store, clock), handler(slow_store, clock)
    async with round_of_three(host, fast, slow), anyio.create_task_group() as tg:
        held = slow_store.stall("get_prefix")  # the read after the doorbell rings
        await host.set_closed()
        await held.wait_held()
        assert (await fast.wait_round_invalidated()).reason is InvalidationReason.CLOSED
        leaving = Leaving(host)
        tg.start_soon(leaving.run)
        await anyio.wait_all_tasks_blocked()
        assert not leaving.left.is_set()
        held.release()
        assert (await slow.wait_round_invalidated()).reason is InvalidationReason.CLOSED
        with anyio.fail_after(10):  # generous: only guards against a hang
            await leaving.left.wait()


async def test_the_host_leaves_at_once_when_everyone_read_the_close() -> None:
    """Nothing to wait for: the host's leaving returns without the clock moving."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    host = handler(store, clock, Hosting(here=True))
    others = [handler(store, clock) for _ in range(2)]
    async with round_of_three(host, *others):
        await others[0].set_closed()
        for each in (host, *others):
            assert (await each.wait_round_invalidated()).reason is InvalidationReason.CLOSED
        with anyio.fail_after(10):
            assert await host.shutdown()
        assert clock.now() == 0


async def test_the_host_waits_at_most_host_leave_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """A member that never reads the close (hung) holds the host host_leave_timeout at most,
    and the host names it."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    host = handler(store, clock, Hosting(timeout=4, here=True))
    fast, hung = handler(store, clock), handler(store, clock)
    async with round_of_three(host, fast, hung), anyio.create_task_group() as tg:
        hang(hung)
        await host.set_closed()
        leaving = Leaving(host)
        tg.start_soon(leaving.run)
        await advance(clock, 3.5, step=0.5)
        assert not leaving.left.is_set()
        with caplog.at_level(logging.WARNING):
            await advance(clock, 0.5)
            with anyio.fail_after(10):
                await leaving.left.wait()
    assert f"node(s) {hung.node_id} still to read the end after 4 s" in caplog.text


async def test_a_joiner_the_close_fails_says_it_read_it() -> None:
    """A node waiting to join when the run closes marks the close read before it raises."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    waiting, closer = handler(store, clock), handler(store, clock)
    async with waiting, closer, anyio.create_task_group() as tg:
        failed = anyio.Event()

        async def join() -> None:
            with pytest.raises(RendezvousClosedError):
                await waiting.next_rendezvous()
            failed.set()

        tg.start_soon(join)
        await anyio.wait_all_tasks_blocked()
        await closer.set_closed()
        await failed.wait()
        seen = await store.get_prefix(f"rdzv/job/{layout.round_prefix(1)}seen/")
    assert list(seen.items) == [f"rdzv/job/{layout.seen_key(1, waiting.node_id)}"]


async def test_a_host_leaving_a_running_round_waits_only_for_the_others_to_read_it() -> None:
    """The host leaves while the round runs: once the others read the loss (their verdict),
    it goes, without waiting for them to leave."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    host = handler(store, clock, Hosting(here=True))
    others = [handler(store, clock) for _ in range(2)]
    async with round_of_three(host, *others):
        with anyio.fail_after(10):  # generous: only guards against a hang
            assert await host.shutdown()
        for each in others:
            verdict = await each.wait_round_invalidated()
            assert verdict.reason is InvalidationReason.PARTICIPANT_LOST
        assert clock.now() == 0
