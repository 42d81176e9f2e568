"""The event stream, its JSON-lines log and its logging subscriber, fed by real components."""

from __future__ import annotations

import contextlib
import enum
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic import timer
from aioelastic.agent import WorkerFailure
from aioelastic.agent._events import WorkerFailed
from aioelastic.events import (
    EventLogError,
    EventRecord,
    EventStream,
    JsonLinesWriter,
    LoggingSubscriber,
    decode_line,
    encode_record,
    observe,
    read_event_log,
    to_data,
)
from aioelastic.testing import EventRecorder, ManualClock
from aioelastic.timer import LocalTimerServer, ScopeExpiredError

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Inner:
    color: Color
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    table: dict[int, float]


async def test_timer_events_reach_the_stream_and_the_log_file(tmp_path: Path) -> None:
    """An expired watchdog scope is recorded as acquired, expired, reaped, in the JSON log too."""
    clock = ManualClock(100.0)
    stream = EventStream(node="n1")
    recorder = EventRecorder()
    stream.subscribe(recorder)
    path = tmp_path / "events.jsonl"
    with JsonLinesWriter(path) as writer:
        stream.subscribe(writer)
        async with LocalTimerServer("t", clock=clock) as server:
            stream.attach(server, "timer")
            client = server.client()

            async def hang_in_a_watched_step() -> None:
                async with timer.expires(after=60, scope="step", client=client):
                    await recorder.wait_for("TimerAcquired")
                    clock.advance(61)
                    await anyio.sleep_forever()

            with pytest.raises(ScopeExpiredError):
                await hang_in_a_watched_step()
            await recorder.wait_for("TimerReaped")
    logged = list(read_event_log(path))
    assert [e.kind for e in logged] == recorder.kinds("timer")
    assert [e.kind for e in logged][:3] == ["TimerAcquired", "TimerExpired", "TimerReaped"]
    assert {(e.node, e.source) for e in logged} == {("n1", "timer")}
    assert logged[0].data["scope_id"] == "step"


def test_a_failing_subscriber_is_counted_and_the_others_still_receive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A subscriber that raises is logged and counted; later subscribers get the record."""
    stream = EventStream(node="n", clock=lambda: 5.0)
    recorder = EventRecorder()

    def broken(record: EventRecord) -> None:
        raise RuntimeError("boom")

    stream.subscribe(broken)
    stream.subscribe(recorder)
    with caplog.at_level(logging.ERROR, logger="aioelastic.events._stream"):
        stream.publish("test", Color.RED)
    stats = stream.statistics()
    assert (stats.published, stats.subscriber_errors, stats.subscribers) == (1, 1, 2)
    assert stats.by_kind == {"Color": 1}
    assert recorder.kinds() == ["Color"]
    assert "event subscriber" in caplog.text


def test_unsubscribe_and_detach_stop_delivery() -> None:
    """After unsubscribing, a subscriber receives nothing more."""
    stream = EventStream(node="n")
    recorder = EventRecorder()
    unsubscribe = stream.subscribe(recorder)
    stream.publish("a", 1)
    unsubscribe()
    unsubscribe()
    stream.publish("a", 2)
    assert len(recorder.records) == 1


def test_nested_events_become_plain_json_data() -> None:
    """Dataclasses, enums, tuples and int-keyed mappings encode as JSON objects and lists."""
    event = Outer("x", Inner(Color.RED, (1, 2)), {3: float("inf")})
    assert to_data(event) == {
        "name": "x",
        "inner": {"color": "red", "sizes": [1, 2]},
        "table": {"3": "inf"},
    }


def test_a_record_survives_a_round_trip_through_a_line() -> None:
    """encode_record then decode_line gives back time, node, source, kind and fields."""
    failure = WorkerFailure(1, 3, 42, returncode=2, timestamp=7.0, error_file="")
    record = EventRecord(12.5, "host", "agent", WorkerFailed(failure))
    logged = decode_line(encode_record(record))
    assert (logged.time, logged.node, logged.source, logged.kind) == (
        12.5,
        "host",
        "agent",
        "WorkerFailed",
    )
    assert logged.data["failure"]["rank"] == 3


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{", "events.jsonl:7: not JSON"),
        ("[1]", "expected an object, got list"),
        ('{"time": 1}', "missing field 'node'"),
        ('{"time": "x", "node": "", "source": "", "kind": "", "event": {}}', "time must be"),
        ('{"time": 1, "node": 1, "source": "", "kind": "", "event": {}}', "must be strings"),
        ('{"time": 1, "node": "", "source": "", "kind": "", "event": 3}', "event must be an"),
    ],
)
def test_a_bad_log_line_is_an_error_naming_the_line(line: str, match: str) -> None:
    """decode_line says which line of which file is wrong, and how."""
    with pytest.raises(EventLogError, match=match):
        decode_line(line, path="events.jsonl", line=7)


@given(st.text())
def test_any_text_decodes_or_raises_event_log_error(text: str) -> None:
    """No input makes decode_line raise anything but EventLogError."""
    with contextlib.suppress(EventLogError):
        decode_line(text)


@given(
    st.dictionaries(
        st.text(),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(),
            lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
            max_leaves=10,
        ),
    )
)
def test_plain_data_fields_survive_the_codec(fields: dict[str, object]) -> None:
    """Any JSON-shaped event payload comes back from a line unchanged."""

    @dataclass(frozen=True)
    class Payload:
        value: dict[str, object]

    line = encode_record(EventRecord(1.0, "n", "s", Payload(fields)))
    assert decode_line(line).data == {"value": json.loads(json.dumps(fields))}


def test_an_unwritable_log_path_is_a_clear_error(tmp_path: Path) -> None:
    """Opening an event log in a missing directory names the path and the reason."""
    with pytest.raises(EventLogError, match="cannot open the event log for appending"):
        JsonLinesWriter(tmp_path / "missing" / "events.jsonl")


@pytest.mark.parametrize(
    ("log_warnings", "level"), [(True, logging.WARNING), (False, logging.DEBUG)]
)
async def test_observe_logs_failures_at_warning_unless_the_caller_reports_them(
    caplog: pytest.LogCaptureFixture, log_warnings: bool, level: int
) -> None:
    """observe() logs a failure at WARNING; with log_warnings=False (the CLI) only at DEBUG."""

    class Component:
        def subscribe(self, callback: object) -> object:
            self.callback = callback
            return lambda: None

    component = Component()
    failure = WorkerFailure(0, 5, 9, returncode=1, timestamp=1.0, error_file="")
    with caplog.at_level(logging.DEBUG, logger="aioelastic.events"):
        async with observe({"agent": component}, log_warnings=log_warnings):
            component.callback(WorkerFailed(failure))  # type: ignore[operator]
    [record] = caplog.records
    assert record.levelno == level
    assert record.getMessage().startswith("agent WorkerFailed")


def test_the_logging_subscriber_logs_fields_as_structured_data(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure is logged at WARNING with its fields as record attributes; others at INFO."""
    stream = EventStream(node="h")
    stream.subscribe(LoggingSubscriber())
    failure = WorkerFailure(0, 5, 9, returncode=1, timestamp=1.0, error_file="")
    with caplog.at_level(logging.INFO, logger="aioelastic.events"):
        stream.publish("agent", WorkerFailed(failure))
        stream.publish("test", Inner(Color.RED, ()))
    first, second = caplog.records
    assert (first.levelno, second.levelno) == (logging.WARNING, logging.INFO)
    assert first.getMessage().startswith("agent WorkerFailed failure.local_rank=0 failure.rank=5")
    assert first.event_fields["failure"]["pid"] == 9  # type: ignore[attr-defined]
    assert first.event_node == "h"  # type: ignore[attr-defined]
