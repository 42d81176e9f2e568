"""The suite's guard records calls that may block an event loop's thread, and only those.

Each test installs a guard of its own inside the suite's: the inner one records, the suite's
lets the call through (so these deliberate offences do not fail the tests).
"""

from __future__ import annotations

import socket
import time

import anyio
import pytest

from tests.blocking import BlockingCalls

pytestmark = pytest.mark.anyio


async def test_a_name_lookup_on_the_loop_is_recorded() -> None:
    """getfqdn and a getaddrinfo of a host name, made on the loop, are found with their caller."""
    with BlockingCalls().installed() as calls:
        socket.getfqdn("localhost")
        socket.getaddrinfo("localhost", 80)
    assert [entry.split("(")[0] for entry in calls.found] == [
        "socket.getfqdn",
        "socket.getaddrinfo",
    ]
    assert all(" from tests/test_blocking_guard.py:" in entry for entry in calls.found)


async def test_a_sleep_on_the_loop_is_recorded_but_not_a_zero_one() -> None:
    """time.sleep(0.001) on the loop is found, once per place; time.sleep(0) is not."""
    with BlockingCalls().installed() as calls:
        time.sleep(0)  # noqa: ASYNC251 - what the guard is for
        for _ in range(3):
            time.sleep(0.001)  # noqa: ASYNC251 - the blocking call under test  # pace
    assert [entry.split("(")[0] for entry in calls.found] == ["time.sleep"]


async def test_numeric_lookups_and_worker_threads_pass() -> None:
    """Numeric addresses resolve without blocking; a lookup in a worker thread is the fix."""
    with BlockingCalls().installed() as calls:
        socket.getaddrinfo("127.0.0.1", 80)
        socket.getaddrinfo("::1", 80)
        await anyio.to_thread.run_sync(socket.getfqdn, "localhost")
        await anyio.getaddrinfo("localhost", 80)
    assert calls.found == []


def test_calls_outside_an_event_loop_pass() -> None:
    """Synchronous code may block: no loop runs on its thread."""
    with BlockingCalls().installed() as calls:
        socket.getfqdn("localhost")
        time.sleep(0.001)  # the blocking call under test  # pace
    assert calls.found == []


def test_the_real_functions_are_back_after_the_block() -> None:
    """Leaving installed() restores what it wrapped."""
    before = socket.getaddrinfo
    with BlockingCalls().installed():
        assert socket.getaddrinfo is not before
    assert socket.getaddrinfo is before
