"""A handler written against torch's interface (its seven methods, as the dummy handler of torch's
``test/distributed/elastic/rendezvous/api_test.py``) is one of ours: it can be created, and the
default ``wait_round_invalidated`` watches it as torch's agent does."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from aioelastic.rendezvous import (
    InvalidationReason,
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousInfo,
    RendezvousParameters,
    RoundInvalidated,
)
from aioelastic.store import BlockingTCPStore, TCPStoreServer

pytestmark = pytest.mark.anyio


class TorchStyleHandler(RendezvousHandler):
    """torch's seven methods, plain (not ``async``), over a blocking store client as torch's
    handlers are: nothing of ours beyond them."""

    def __init__(self, params: RendezvousParameters, store: BlockingTCPStore | None) -> None:
        self.params = params
        self.store = store
        self.looked = threading.Event()
        """Set once num_nodes_waiting() was asked (a whole look of the watch)."""

    def get_backend(self) -> str:  # type: ignore[override]
        return "dummy_backend"

    def next_rendezvous(self) -> RendezvousInfo:  # type: ignore[override]
        raise NotImplementedError

    def is_closed(self) -> bool:  # type: ignore[override]
        assert self.store is not None
        return self.store.check(["closed"])

    def set_closed(self) -> None:  # type: ignore[override]
        assert self.store is not None
        self.store.set("closed", b"1")

    def num_nodes_waiting(self) -> int:  # type: ignore[override]
        assert self.store is not None
        waiting = self.store.add("waiting", 0)
        self.looked.set()
        return waiting

    def get_run_id(self) -> str:
        return self.params.run_id

    def shutdown(self) -> bool:  # type: ignore[override]
        return False


def dummy_params() -> RendezvousParameters:
    return RendezvousParameters("dummy_backend", "dummy_endpoint", "dummy_run_id", 1, 1)


def test_a_handler_with_torchs_seven_methods_is_created_by_the_registry() -> None:
    """Registered and created as in torch's registry test: no abstract method is left over."""
    registry = RendezvousHandlerRegistry()
    registry.register("dummy_backend", lambda params: TorchStyleHandler(params, None))
    params = dummy_params()
    handler = registry.create_handler(params)
    assert isinstance(handler, TorchStyleHandler)
    assert handler.params is params


@pytest.fixture
async def served() -> AsyncIterator[TCPStoreServer]:
    async with TCPStoreServer("127.0.0.1", 0) as server:
        yield server


async def watched(handler: TorchStyleHandler, change: Callable[[], object]) -> RoundInvalidated:
    """Run the default wait; once it has looked at an unchanged round, ``change()`` the store
    (in a thread: the store server runs on this loop); return what the wait says."""
    outcome: list[RoundInvalidated] = []

    async def wait() -> None:
        outcome.append(await handler.wait_round_invalidated())

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.to_thread.run_sync(handler.looked.wait)
            assert outcome == []  # a round nothing changed is still valid
            await anyio.to_thread.run_sync(change)
    return outcome[0]


@pytest.mark.parametrize(
    ("key", "reason", "detail"),
    [
        ("closed", InvalidationReason.CLOSED, "run 'dummy_run_id' was closed"),
        ("waiting", InvalidationReason.NODES_WAITING, "2 nodes waiting to join"),
    ],
)
async def test_the_default_wait_ends_when_torchs_agent_would_restart(
    served: TCPStoreServer, key: str, reason: InvalidationReason, detail: str
) -> None:
    """The run closed, or nodes waiting to join: the default wait returns saying which."""
    own, other = [
        await anyio.to_thread.run_sync(BlockingTCPStore, "127.0.0.1", served.port) for _ in "ab"
    ]
    with own, other:
        handler = TorchStyleHandler(dummy_params(), own)
        handler.monitor_interval = 0.01
        peer = TorchStyleHandler(dummy_params(), other)
        change = peer.set_closed if key == "closed" else lambda: other.add(key, 2)
        assert await watched(handler, change) == RoundInvalidated(reason, detail)
