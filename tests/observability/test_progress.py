"""A long rendezvous reports its progress every few seconds instead of staying silent."""

from __future__ import annotations

import io
import logging

import anyio
import pytest

from aioelastic.events import EventStream, RendezvousWaiting, watch_rendezvous
from aioelastic.testing import EventRecorder, RendezvousCluster

pytestmark = pytest.mark.anyio


async def test_a_lone_node_reports_what_it_waits_for_every_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One node of three joined: a report every 5 s of manual time says it waits for 2 more."""
    stream, recorder, console = EventStream(node="n"), EventRecorder(), io.StringIO()
    stream.subscribe(recorder)
    async with RendezvousCluster(1, min_nodes=3, join_timeout=600) as cluster:
        node = cluster.nodes[0]
        with caplog.at_level(logging.INFO, logger="aioelastic.rendezvous.progress"):
            async with watch_rendezvous(
                node.handler, stream, interval=5, console=console, clock=cluster.clock
            ):
                await cluster.start_join()
                await cluster.advance(16, step=1)
    reports = [r.event for r in recorder.of("RendezvousWaiting")]
    assert [r.waited for r in reports] == [5.0, 10.0, 15.0]
    assert {(r.joined, r.min_nodes) for r in reports} == {(1, 3)}
    assert (
        "waiting 15 s for 2 more nodes (min_nodes=3); 1 joined so far (node 1 at 127.0.0.1)"
        in console.getvalue()
    )
    assert "join timeout in 585 s" in caplog.text


async def test_reports_stop_once_the_round_completes() -> None:
    """After the round completes, time passing produces no more reports."""
    stream, recorder = EventStream(node="n"), EventRecorder()
    stream.subscribe(recorder)
    async with RendezvousCluster(2, min_nodes=2, max_nodes=3) as cluster:
        async with watch_rendezvous(
            cluster.nodes[0].handler, stream, interval=5, clock=cluster.clock
        ):
            await cluster.rendezvous()  # the last call takes 10 s of manual time
            during = len(recorder.of("RendezvousWaiting"))
            await cluster.advance(30)
        assert len(recorder.of("RendezvousWaiting")) == during
    assert during >= 1


def test_a_node_past_min_nodes_waits_for_the_last_call() -> None:
    """With min_nodes reached, the report says the node waits for the last call to end."""
    waiting = RendezvousWaiting("job", 4, 3, 2, 8, 12.0, 600.0)
    assert "the last call for up to max_nodes=8 to end" in waiting.describe()


async def test_a_handler_without_events_is_left_alone() -> None:
    """A handler with no subscribe() gets no reports and no error."""
    with anyio.fail_after(5):
        async with watch_rendezvous(object()):
            pass


async def test_the_handlers_own_events_reach_the_stream() -> None:
    """With a stream, watch_rendezvous publishes the handler's events as 'rendezvous'."""
    stream, recorder = EventStream(node="n"), EventRecorder()
    stream.subscribe(recorder)
    async with RendezvousCluster(1, min_nodes=1, max_nodes=1) as cluster:
        async with watch_rendezvous(cluster.nodes[0].handler, stream, clock=cluster.clock):
            await cluster.rendezvous()
        await cluster.rendezvous()  # after the block: no longer published
    assert recorder.kinds("rendezvous") == ["RoundJoining", "RoundCompleted"]


async def test_an_error_in_the_watched_block_leaves_as_itself() -> None:
    """The watcher's task group does not wrap the block's error in an exception group."""
    async with RendezvousCluster(1) as cluster:
        with pytest.raises(LookupError, match="boom"):
            async with watch_rendezvous(cluster.nodes[0].handler, clock=cluster.clock):
                raise LookupError("boom")
