"""Fixtures for rendezvous tests: a manual clock, one MemoryStore, and handlers over it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.store import MemoryStore
from aioelastic.testing import ManualClock

MakeHandler = Callable[..., ElasticRendezvousHandler]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def make_handler(store: MemoryStore, clock: ManualClock) -> MakeHandler:
    """Create ``memory`` handlers of run ``job`` over the test's store and clock."""

    def make(min_nodes: int = 2, max_nodes: int = 3, **config: Any) -> ElasticRendezvousHandler:
        options: dict[str, Any] = {
            "store": store,
            "clock": clock,
            "last_call_timeout": 10,
            "join_timeout": 100,
            "keep_alive_interval": 5,
            "heartbeat_timeout": 15,
        }
        options.update(config)
        params = RendezvousParameters("memory", "", "job", min_nodes, max_nodes, **options)
        handler = get_rendezvous_handler(params)
        assert isinstance(handler, ElasticRendezvousHandler)
        return handler

    return make


async def advance(clock: ManualClock, seconds: float, step: float = 1.0) -> None:
    """Move time in steps, letting every task react (keep-alives, expiries) after each."""
    await anyio.wait_all_tasks_blocked()
    while seconds > 1e-9:
        delta = min(step, seconds)
        clock.advance(delta)
        seconds -= delta
        await anyio.wait_all_tasks_blocked()


def hang(handler: ElasticRendezvousHandler) -> None:
    """Fault injection: the node hangs (no more keep-alives, no more watching its round)."""
    assert handler._stop_keep_alive is not None
    handler._stop_keep_alive()
    for stop in (handler._stop_inbox, handler._stop_successor):
        if stop is not None:
            stop()
