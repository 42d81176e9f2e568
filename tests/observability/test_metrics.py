"""Prometheus metrics from the event stream, served over HTTP from the event loop."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import anyio
import pytest

from aioelastic._kinds.agent import RankStepTime
from aioelastic.agent._events import (
    GroupRestarting,
    MembershipChanged,
    RendezvousCompleted,
    StepTimes,
    WorkerReaped,
)
from aioelastic.events import EventRecord, RendezvousWaiting, observe, read_event_log
from aioelastic.metrics import (
    MetricsPortError,
    PrometheusMetrics,
    metrics_listener,
    serve_metrics,
)
from aioelastic.metrics._prometheus import response
from aioelastic.timer import ProcessExited, TimerAcquired, TimerReleased

pytest.importorskip("prometheus_client", reason="needs the metrics extra (prometheus-client)")

pytestmark = pytest.mark.anyio


def completed(world_size: int) -> RendezvousCompleted:
    return RendezvousCompleted(0, 1, world_size, "127.0.0.1", 29500)


def feed(metrics: PrometheusMetrics, *timed_events: tuple[float, object]) -> None:
    for when, event in timed_events:
        metrics(EventRecord(when, "n", "agent", event))


def value(metrics: PrometheusMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_straggler_window_sets_each_ranks_step_time_and_the_straggler_count() -> None:
    """``StepTimes`` sets the per-rank median and score and how many ranks straggle."""
    metrics = PrometheusMetrics()
    ranks = (RankStepTime(0, 0.1, 1.0, 9), RankStepTime(3, 0.3, 1 / 3, 4))
    feed(metrics, (1.0, StepTimes(0.0, 60.0, ranks, (3,), 1 / 0.75)))
    assert value(metrics, "aioelastic_rank_step_seconds", rank="3") == 0.3
    assert value(metrics, "aioelastic_rank_straggler_score", rank="0") == 1.0
    assert value(metrics, "aioelastic_stragglers") == 1
    feed(metrics, (2.0, StepTimes(60.0, 120.0, ranks[:1], (), 1 / 0.75)))
    assert value(metrics, "aioelastic_stragglers") == 0


def test_agent_events_drive_counters_gauges_and_the_duration_histogram() -> None:
    """Restarts, reaps, rounds, world size and rendezvous durations follow the events."""
    metrics = PrometheusMetrics(start=100.0)
    feed(
        metrics,
        (102.0, completed(4)),
        (110.0, WorkerReaped(0, 0, 7, "step", 9)),
        (110.5, GroupRestarting(1, 3)),
        (111.0, completed(4)),
        (120.0, MembershipChanged("NODES_WAITING", "node 3 waits")),
        (125.0, completed(6)),
    )
    assert value(metrics, "aioelastic_rendezvous_rounds_total") == 3
    assert value(metrics, "aioelastic_restarts_total") == 1
    assert value(metrics, "aioelastic_watchdog_reaps_total") == 1
    assert value(metrics, "aioelastic_membership_changes_total") == 1
    assert value(metrics, "aioelastic_world_size") == 6
    assert value(metrics, "aioelastic_rendezvous_duration_seconds_sum") == 2.0 + 0.5 + 5.0
    assert value(metrics, "aioelastic_rendezvous_duration_seconds_count") == 3
    assert value(metrics, "aioelastic_events_total", source="agent", kind="WorkerReaped") == 1


def test_waiting_nodes_follow_progress_reports_until_the_round_completes() -> None:
    """A progress report sets the waiting-nodes gauge; the completed round resets it."""
    metrics = PrometheusMetrics(start=0.0)
    feed(metrics, (5.0, RendezvousWaiting("job", 0, 2, 3, 4, 5.0, 600.0)))
    assert value(metrics, "aioelastic_rendezvous_waiting_nodes") == 2
    feed(metrics, (9.0, completed(3)))
    assert value(metrics, "aioelastic_rendezvous_waiting_nodes") == 0
    assert value(metrics, "aioelastic_rendezvous_duration_seconds_sum") == 9.0


def test_active_timers_count_armed_scopes_until_released_or_their_process_exits() -> None:
    """The active-timers gauge counts distinct (pid, scope) pairs that are armed."""
    metrics = PrometheusMetrics(start=0.0)
    feed(
        metrics,
        (1.0, TimerAcquired(10, "a", 5.0, 5.0, 9)),
        (1.0, TimerAcquired(10, "a", 6.0, 6.0, 9)),
        (1.0, TimerAcquired(11, "b", 5.0, 5.0, 9)),
        (1.0, TimerAcquired(11, "c", 5.0, 5.0, 9)),
    )
    assert value(metrics, "aioelastic_active_timers") == 3
    feed(metrics, (2.0, TimerReleased(10, "a")), (3.0, ProcessExited(11, ("b", "c"))))
    assert value(metrics, "aioelastic_active_timers") == 0


async def test_the_metrics_endpoint_answers_a_scrape() -> None:
    """GET /metrics returns the exposition; another path is a 404."""
    metrics = PrometheusMetrics(start=0.0)
    feed(metrics, (1.0, completed(3)))
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_metrics, metrics, await metrics_listener(0, "127.0.0.1"))
        replies = []
        for path in ("/metrics", "/nope"):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                reply = b""
                with anyio.fail_after(10):  # generous: a local reply
                    while True:
                        try:
                            reply += await stream.receive()
                        except anyio.EndOfStream:
                            break
                replies.append(reply.decode())
        tg.cancel_scope.cancel()
    assert replies[0].startswith("HTTP/1.1 200 OK")
    assert "aioelastic_world_size 3.0" in replies[0]
    assert replies[1].startswith("HTTP/1.1 404")


async def test_a_port_in_use_is_a_clear_error() -> None:
    """Binding a busy metrics port says which port and what to do."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(MetricsPortError, match=f"127.0.0.1:{port}.*another --metrics-port"):
            await metrics_listener(port, "127.0.0.1")


async def test_observe_writes_the_events_of_attached_components(tmp_path: Path) -> None:
    """observe() attaches components for the block only, writing their events to the file."""

    class Component:
        def __init__(self) -> None:
            self.callbacks: list[object] = []

        def subscribe(self, callback: object) -> object:
            self.callbacks.append(callback)
            return lambda: self.callbacks.remove(callback)

    component = Component()
    path = tmp_path / "events.jsonl"
    async with observe({"agent": component}, events_file=path, metrics_port=0, node="n"):
        (callback,) = component.callbacks
        callback(completed(2))  # type: ignore[operator]
    assert component.callbacks == []
    assert [(e.node, e.source, e.kind) for e in read_event_log(path)] == [
        ("n", "agent", "RendezvousCompleted")
    ]


async def test_an_error_in_an_observed_block_leaves_as_itself() -> None:
    """observe() with a metrics server does not wrap the block's error in an exception group."""
    with pytest.raises(LookupError, match="boom"):
        async with observe({}, metrics_port=0, metrics_host="127.0.0.1"):
            raise LookupError("boom")


def test_armed_timers_are_listed_soonest_first_with_time_left() -> None:
    """timers(now) lists (pid, scope, seconds left) of armed timers, soonest deadline first."""
    metrics = PrometheusMetrics(start=0.0)
    feed(
        metrics,
        (1.0, TimerAcquired(10, "late", 50.0, 0.0, 9)),
        (1.0, TimerAcquired(11, "soon", 20.0, 0.0, 9)),
        (1.0, TimerAcquired(12, "gone", 30.0, 0.0, 9)),
        (2.0, TimerReleased(12, "gone")),
    )
    assert metrics.timers(now=15.0) == [
        {"pid": 11, "scope_id": "soon", "seconds_left": 5.0},
        {"pid": 10, "scope_id": "late", "seconds_left": 35.0},
    ]
    reply = response(b"GET /timers HTTP/1.1\r\n\r\n", metrics, 15.0)
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert b'"scope_id": "soon"' in reply


async def test_status_lists_a_nodes_timers_from_its_metrics_endpoint() -> None:
    """`aioelastic status --timers HOST:PORT` prints the node's armed scopes and time left."""
    metrics = PrometheusMetrics(start=0.0)
    feed(metrics, (1.0, TimerAcquired(4242, "epoch-3/step-17", anyio.current_time() + 600, 0, 9)))
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_metrics, metrics, await metrics_listener(0, "127.0.0.1"))
        with anyio.fail_after(60):  # generous: a subprocess on a loaded machine
            done = await anyio.run_process(
                [sys.executable, "-m", "aioelastic", "status", "--timers", f"127.0.0.1:{port}"],
                check=False,
            )
        tg.cancel_scope.cancel()
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert "1 watchdog timer armed" in out
    pid, left, scope = next(line for line in out.splitlines() if "epoch-3" in line).split()
    assert (pid, scope) == ("4242", "epoch-3/step-17")
    assert 0 < float(left) <= 600
    assert f"node 127.0.0.1:{port}: no learned timeout yet" in out
