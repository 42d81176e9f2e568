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
from aioelastic.rendezvous import ElasticRendezvousHandler, ElasticSettings
from aioelastic.store import MemoryStore, TCPStoreServer
from aioelastic.testing import FaultyStore
from aioelastic.timer import FileTimerServer, LocalTimerServer


def handler() -> ElasticRendezvousHandler:
    return ElasticRendezvousHandler(MemoryStore(), ElasticSettings("job", 1, 1), backend="memory")


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
