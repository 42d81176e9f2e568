"""The subscriber list every event-emitting component shares."""

import logging

import pytest

from aioelastic._subscribers import Subscribers

log = logging.getLogger("test.subscribers")


def test_events_reach_callbacks_in_subscription_order() -> None:
    """The initial callback comes first, then later subscriptions, each event in order."""
    seen: list[tuple[str, int]] = []
    subscribers: Subscribers[int] = Subscribers(log, "test", lambda e: seen.append(("a", e)))
    subscribers.add(lambda e: seen.append(("b", e)))
    subscribers.emit(1)
    subscribers.emit(2)
    assert seen == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def test_unsubscribe_is_idempotent_and_works_from_inside_a_callback() -> None:
    """A callback that unsubscribes itself while called gets no later events."""
    seen: list[int] = []
    subscribers: Subscribers[int] = Subscribers(log, "test")

    def once(event: int) -> None:
        seen.append(event)
        unsubscribe()

    unsubscribe = subscribers.add(once)
    subscribers.emit(1)
    subscribers.emit(2)
    unsubscribe()
    assert seen == [1]
    assert not subscribers


def test_a_raising_callback_is_logged_counted_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The others still get the event; the failure is logged with what failed, and counted."""
    seen: list[int] = []

    def broken(event: int) -> None:
        raise RuntimeError("boom")

    subscribers: Subscribers[int] = Subscribers(log, "test event", broken)
    subscribers.add(seen.append)
    with caplog.at_level(logging.ERROR, logger="test.subscribers"):
        subscribers.emit(7)
    assert seen == [7]
    assert subscribers.errors == 1
    assert "test event subscriber" in caplog.text
    assert "boom" in caplog.text
