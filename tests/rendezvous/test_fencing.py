"""Fencing: a node that cannot renew its liveness in time gives up its round before anyone
may take its ranks, and joins again once the store answers (manual clock, in one loop)."""

from __future__ import annotations

import logging

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.rendezvous import InvalidationReason, RendezvousConnectionError
from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous._lease import Lease, RenewalFailures
from aioelastic.testing import ManualClock, RendezvousCluster

pytestmark = pytest.mark.anyio


def test_a_lease_lapses_a_margin_before_the_key_may_expire() -> None:
    """Renewed at 10 with a 5 s timeout and a 1 s margin: valid before 14, lapsed from 14."""
    lease = Lease.for_settings(heartbeat_timeout=5, keep_alive_interval=1)
    lease.renewed(10.0)
    assert (lease.fence_at, lease.lapsed(13.99), lease.lapsed(14.0)) == (14.0, False, True)


def test_a_lease_never_renewed_is_lapsed() -> None:
    """Before any acknowledged renewal the node has no claim to liveness."""
    assert Lease.for_settings(5, 1).lapsed(-1e9)


@given(
    st.lists(
        st.tuples(st.floats(0, 1e4), st.floats(0, 10)),  # (sent at, delay until applied)
        min_size=1,
        max_size=20,
    )
)
def test_the_fence_never_comes_after_the_key_may_expire(
    renewals: list[tuple[float, float]],
) -> None:
    """Whatever order acknowledgements arrive in, the node fences no later than the store
    could expire its key (timeout after the last renewal it applied, which came no earlier
    than it was sent), by at least the margin."""
    lease = Lease.for_settings(heartbeat_timeout=5, keep_alive_interval=1)
    for sent, _ in renewals:
        lease.renewed(sent)
    earliest_expiry = max(sent + delay for sent, delay in renewals) + 5
    assert lease.fence_at <= earliest_expiry - lease.margin
    assert lease.fence_at == max(sent for sent, _ in renewals) + 5 - lease.margin


async def test_stalled_keep_alives_fence_the_round_before_others_see_the_node_lost() -> None:
    """A node whose keep-alives hang gives up its round as FENCED while the others still hold
    it valid: it stops first, then its liveness key expires for them."""
    async with RendezvousCluster(2) as cluster:
        await cluster.rendezvous()
        lonely, other = cluster.nodes[1], cluster.nodes[0]
        stall = lonely.store.stall("set")
        settings = cluster.settings
        lease_left = settings.heartbeat_timeout - min(
            settings.keep_alive_interval, settings.heartbeat_timeout / 4
        )
        await cluster.advance(lease_left, step=settings.keep_alive_interval / 4)
        assert other.handler.statistics().invalidated is None
        verdict = await lonely.handler.wait_round_invalidated()
        assert verdict.reason is InvalidationReason.FENCED
        assert "no liveness renewal acknowledged" in verdict.detail
        await cluster.advance(settings.heartbeat_timeout)
        lost = await other.handler.wait_round_invalidated()
        assert lost.reason is InvalidationReason.PARTICIPANT_LOST
        stall.release()


async def test_a_node_cut_off_while_joining_joins_once_the_store_answers() -> None:
    """Joining retries a store that fails for less than read_timeout instead of giving up."""
    async with RendezvousCluster(2, read_timeout=60.0) as cluster:
        await cluster.rendezvous()
        node = cluster.nodes[1]
        cluster.partition(node)
        await cluster.advance(cluster.settings.heartbeat_timeout)
        await cluster.start_join(cluster.nodes)
        await cluster.advance(20.0)
        assert node.joining
        cluster.heal(node)
        infos = await cluster.wait_joined()
    assert sorted(info.rank for info in infos) == [0, 1]
    assert min(info.round for info in infos) == max(info.round for info in infos) > 1


async def test_joining_gives_up_after_read_timeout_without_the_store() -> None:
    """A store unreachable for read_timeout ends the join with RendezvousConnectionError."""
    async with RendezvousCluster(1, read_timeout=30.0) as cluster:
        await cluster.rendezvous()
        node = cluster.nodes[0]
        cluster.partition(node)
        await cluster.start_join([node])
        with pytest.raises(RendezvousConnectionError, match="lost its store"):
            await cluster.wait_joined([node])


async def test_a_paused_node_fences_when_it_runs_again() -> None:
    """A node whose process stood still past its lease (SIGSTOP, a stalled loop) fences its
    round when it runs again, whichever of its tasks wakes first."""
    async with RendezvousCluster(2) as cluster:
        await cluster.rendezvous()
        cluster.clock.advance(2 * cluster.settings.heartbeat_timeout)  # no task ran meanwhile
        verdicts = [await node.handler.wait_round_invalidated() for node in cluster.nodes]
    assert [v.reason for v in verdicts] == [InvalidationReason.FENCED] * 2


class SpinCheckingClock(ManualClock):
    """A manual clock that fails the task reading it too often while time stands still: a
    task that re-reads it in a loop without ever yielding holds the whole event loop."""

    READS = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def now(self) -> float:
        self.reads += 1
        if self.reads > self.READS:
            raise AssertionError(f"the clock was read {self.READS} times while time stood still")
        return super().now()

    def advance(self, seconds: float) -> None:
        self.reads = 0
        super().advance(seconds)


async def test_watching_the_lease_just_after_a_renewal_holds_no_loop_and_no_fence() -> None:
    """Watching the lease (as an agent does while it joins with its workers running) right
    after a renewal was acknowledged, before the keep-alive task ran, waits for the next
    renewal: it does not re-await the renewal's event, which on asyncio returns at once and so
    held the loop until the lease lapsed (no more renewals could run) and fenced the node."""
    clock = SpinCheckingClock()
    async with RendezvousCluster(2, clock=clock) as cluster:
        await cluster.rendezvous()
        handler = cluster.nodes[0].handler
        timeout, interval = cluster.settings.heartbeat_timeout, cluster.settings.keep_alive_interval
        watching = anyio.CancelScope()

        async def keep_time() -> None:
            await cluster.advance(3 * timeout, step=interval / 4)
            watching.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_time)
            await handler._renew()  # acknowledged; the keep-alive task is woken, not yet run
            with watching:
                await handler.wait_lease_lapsed()
        assert watching.cancelled_caught
        assert handler.statistics().invalidated is None


async def test_a_successor_whose_key_outlives_its_renewals_is_reported_lost() -> None:
    """The predecessor reports a node lost one heartbeat timeout after its last renewal even
    if the store keeps the key longer (an etcd leader change extends every lease)."""
    async with RendezvousCluster(2) as cluster:
        await cluster.rendezvous()
        watcher, silent = cluster.nodes
        cluster.partition(silent)
        key = f"rdzv/{cluster.run_id}/{layout.alive_key(silent.handler.node_id)}"
        cluster.store.set_nowait(key, layout.encode_alive(1000.0), ttl=1000.0)  # extended, once
        await cluster.advance(cluster.settings.heartbeat_timeout + 1)
        verdict = await watcher.handler.wait_round_invalidated()
        assert cluster.store.get_nowait([key]) is not None
    assert verdict.reason is InvalidationReason.PARTICIPANT_LOST


def test_a_run_of_failed_keep_alives_is_logged_once_then_summarised() -> None:
    """The first failure of a run gives a line with its reason, the others none; the renewal
    that ends the run gives one summary, and the next failure starts a new run."""
    failures = RenewalFailures()
    assert failures.failed(10.0, 10.5, "no reply") == (
        "keep-alive failed: no reply; failing again is summarised once it recovers or fences"
    )
    assert [failures.failed(t, t + 0.5, "refused") for t in (11.0, 12.0)] == [None, None]
    assert failures.summary(13.0) == "3 keep-alive(s) failed over 2.5 s (last: refused)"
    assert failures.renewed(13.0, 13.5) == (
        "keep-alive recovered after 3 keep-alive(s) failed over 3.0 s (last: refused)"
    )
    assert (failures.summary(14.0), failures.renewed(14.0, 14.1)) == (None, None)
    assert failures.failed(15.0, 15.2, "no reply") is not None


def test_a_stale_attempt_failing_after_a_renewal_starts_no_run() -> None:
    """An attempt that hung while a newer one was acknowledged is not a new failure."""
    failures = RenewalFailures()
    failures.renewed(12.0, 12.1)
    assert failures.failed(11.0, 13.0, "no reply") is None
    assert failures.summary(13.0) is None


async def test_a_partitioned_node_logs_its_failing_keep_alives_once_then_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cut off for many keep-alive intervals, a node warns once when keep-alives start failing,
    adds the run's summary to its fence line, and sums the run up once when they recover."""
    caplog.set_level(logging.WARNING, logger="aioelastic.rendezvous")
    async with RendezvousCluster(2) as cluster:
        await cluster.rendezvous()
        node = cluster.nodes[1]
        cluster.partition(node)
        await cluster.advance(4 * cluster.settings.heartbeat_timeout)
        verdict = await node.handler.wait_round_invalidated()
        cluster.heal(node)
        await cluster.advance(2 * cluster.settings.keep_alive_interval)
        lines = [r.getMessage() for r in caplog.records if "keep-alive" in r.getMessage()]
    assert verdict.reason is InvalidationReason.FENCED
    assert [line.split(": ", 1)[1].split(" ", 2)[:2] for line in lines] == [
        ["keep-alive", "failed:"],
        ["round", "1"],
        ["keep-alive", "recovered"],
    ]
    assert "lost its store" in lines[0]
    assert "keep-alive(s) failed over" in lines[1]
