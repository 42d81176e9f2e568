"""Event sinks match events by their types, not by class names a rename would silently break."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

import aioelastic.agent
import aioelastic.store._etcd_events
import aioelastic.timer
from aioelastic.agent import WorkerFailed, WorkerFailure
from aioelastic.events import (
    EventRecord,
    JsonLinesWriter,
    LoggingSubscriber,
    WarningEvent,
    read_event_log,
)
from aioelastic.testing import EventRecorder
from aioelastic.timer import TimerAcquired

pytestmark = pytest.mark.anyio

EMITTING_PARTS = (aioelastic.agent, aioelastic.timer, aioelastic.store._etcd_events)
"""Imported so that every event class of the parts exists when its subclasses are listed."""


@dataclass(frozen=True, slots=True)
class Lookalike:
    """An unrelated event that happens to share a name with one of ours."""

    note: str = "not ours"


def lookalike(name: str) -> object:
    return type(name, (Lookalike,), {})()


def failed() -> WorkerFailed:
    return WorkerFailed(WorkerFailure(1, 1, 100, 3, 2.0, "error.json", "exit 3"))


def record(event: object) -> EventRecord:
    return EventRecord(1.0, "n", "agent", event)


def subclasses(base: type) -> set[str]:
    found, todo = set(), [base]
    while todo:
        for child in todo.pop().__subclasses__():
            found.add(child.__name__)
            todo.append(child)
    return found


def test_the_parts_mark_the_same_events_as_warnings_as_before() -> None:
    """The events logged at WARNING are those the kind-name list used to hold, plus the ones
    added since (a worker restarted to leave its world, a fork template lost, a straggler
    named, a preemption noticed)."""
    assert subclasses(WarningEvent) == {
        "WorkerFailed",
        "WorkerReaped",
        "StacksCaptured",
        "TimerExpired",
        "TimerReaped",
        "RequestRejected",
        "MembershipChanged",
        "NodeFenced",
        "ShutdownRequested",
        "EtcdFailover",
        "EtcdLeaseLost",
        "WorkerRestartedToLeave",
        "TemplateLost",
        "StragglerDetected",
        "PreemptionNoticed",
    }


def test_the_logging_subscriber_warns_on_the_type_not_the_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real failure is a WARNING; an unrelated class named WorkerFailed stays at INFO."""
    subscriber = LoggingSubscriber(logging.getLogger("test.sinks"))
    with caplog.at_level(logging.INFO, logger="test.sinks"):
        subscriber(record(failed()))
        subscriber(record(lookalike("WorkerFailed")))
    assert [(r.event_kind, r.levelno) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("WorkerFailed", logging.WARNING),
        ("WorkerFailed", logging.INFO),
    ]


def test_the_event_log_skips_the_types_it_is_given(tmp_path: Path) -> None:
    """skip_kinds leaves out TimerAcquired events, not other classes of that name."""
    path = tmp_path / "events.jsonl"
    with JsonLinesWriter(path, skip_kinds=(TimerAcquired,)) as writer:
        writer(record(TimerAcquired(7, "step", 12.0, 1700000000.0, 9)))
        writer(record(lookalike("TimerAcquired")))
    assert [e.data for e in read_event_log(path)] == [{"note": "not ours"}]


def test_metrics_count_a_failure_by_its_type() -> None:
    """Only a real WorkerFailed moves the failure counter; every event counts by kind."""
    pytest.importorskip("prometheus_client", reason="needs the metrics extra (prometheus-client)")
    from aioelastic.metrics import PrometheusMetrics

    metrics = PrometheusMetrics(start=0.0)
    metrics(record(failed()))
    metrics(record(lookalike("WorkerFailed")))
    sample = metrics.registry.get_sample_value
    assert sample("aioelastic_worker_failures_total", {}) == 1
    assert sample("aioelastic_events_total", {"source": "agent", "kind": "WorkerFailed"}) == 2


async def test_the_recorder_finds_records_by_type_or_by_name() -> None:
    """of() and wait_for() take an event type (subclasses match) or a class name."""
    recorder = EventRecorder()
    recorder(record(failed()))
    recorder(record(lookalike("WorkerFailed")))
    assert [r.event for r in recorder.of(WorkerFailed)] == [failed()]
    assert len(recorder.of(WarningEvent)) == 1
    assert len(recorder.of("WorkerFailed")) == 2
    assert (await recorder.wait_for(Lookalike)).event.note == "not ours"
