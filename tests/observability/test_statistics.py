"""Every server, handler and agent answers statistics() with a frozen snapshot, at any time."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aioelastic.agent import ElasticAgent, WorkerSpec
from aioelastic.events import EventStream
from aioelastic.rendezvous import (
    ElasticRendezvousHandler,
    ElasticSettings,
    InvalidationReason,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aioelastic.rendezvous._static import StaticRendezvousHandler
from aioelastic.store import MemoryStore, TCPStoreServer
from aioelastic.testing import FaultyStore
from aioelastic.timer import FileTimerServer, LocalTimerServer
from tests.rendezvous.test_backends import unused_port


def handler() -> ElasticRendezvousHandler:
    return ElasticRendezvousHandler(MemoryStore(), ElasticSettings("job", 1, 1), backend="memory")


def static_handler(port: int = 29400) -> StaticRendezvousHandler:
    params = RendezvousParameters("static", f"127.0.0.1:{port}", "job", 1, 1, rank=0)
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, StaticRendezvousHandler)
    return handler


def etcd_store() -> Any:
    pytest.importorskip("aetcd", reason="needs the etcd extra")
    from aioelastic.store import EtcdStore

    return EtcdStore("127.0.0.1:2379")


FACTORIES: dict[str, Callable[[Path], Any]] = {
    "MemoryStore": lambda _: MemoryStore(),
    "TCPStoreServer": lambda _: TCPStoreServer(),
    "EtcdStore": lambda _: etcd_store(),
    "FileTimerServer": lambda tmp: FileTimerServer(str(tmp / "timer.fifo"), "job"),
    "LocalTimerServer": lambda _: LocalTimerServer("job"),
    "ElasticRendezvousHandler": lambda _: handler(),
    "StaticRendezvousHandler": lambda _: static_handler(),
    "ElasticAgent": lambda _: ElasticAgent(WorkerSpec(sys.executable, handler())),
    "EventStream": lambda _: EventStream(),
    "FaultyStore": lambda _: FaultyStore(MemoryStore()),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_statistics_is_a_frozen_snapshot_before_use(name: str, tmp_path: Path) -> None:
    """statistics() works before the component runs and returns a frozen dataclass."""
    snapshot = FACTORIES[name](tmp_path).statistics()
    assert dataclasses.is_dataclass(snapshot)
    field = dataclasses.fields(snapshot)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(snapshot, field, None)


@pytest.mark.anyio
async def test_static_handler_statistics_follow_its_round() -> None:
    """A static handler's snapshot counts its round, then records the run's closing."""
    async with static_handler(unused_port()) as static:
        before = static.statistics()
        info = await static.next_rendezvous()
        await static.set_closed()
        await static.wait_round_invalidated()
        after = static.statistics()
    assert (before.rounds_completed, before.joining, before.invalidated) == (0, False, None)
    assert (after.rank, after.world_size, after.rounds_completed) == (info.rank, 1, 1)
    assert after.invalidated is not None
    assert after.invalidated.reason is InvalidationReason.CLOSED
