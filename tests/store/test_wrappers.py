"""Stores that wrap a store hand every optional operation to it, not to ``Store``'s default.

``Store``'s defaults for the optional operations split them into the basic ones (``get_prefixes``
into one ``get_prefix`` after another). A wrapper that forgets one still works, but over etcd it
then makes two requests at two revisions where the backend makes one transaction, and a bench
counting through it counts what production does not do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from aioelastic.store import MemoryStore, PrefixStore, Snapshot, Store, Value
from aioelastic.testing import FaultyStore
from bench.rendezvous import CountingStore
from bench.scale import MeteredStore

pytestmark = pytest.mark.anyio


class RecordingStore(MemoryStore):
    """A memory store that offers every optional operation and records which were called
    (its key counting is a write then a read: enough here, not atomic like etcd's)."""

    def __init__(self) -> None:
        super().__init__()
        self.called: list[str] = []

    @property
    def counts_keys(self) -> bool:
        return True

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        self.called.append("get_prefixes")
        return await super().get_prefixes(prefixes)

    async def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> int:
        self.called.append("multi_set_and_count")
        await self.multi_set(keys, values)
        return len((await super().get_prefix(prefix)).items)

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        self.called.append("multi_set_count_and_read")
        await self.multi_set(keys, values)
        return len((await super().get_prefix(prefix)).items), await super().get_prefix(read)

    async def ttl_remaining(self, key: str) -> float | None:
        self.called.append("ttl_remaining")
        return await super().ttl_remaining(key)


WRAPPERS: dict[str, Callable[[Store], Store]] = {
    "prefix": lambda inner: PrefixStore("job/", inner),
    "faulty": lambda inner: FaultyStore(inner),
    "bench.scale": lambda inner: MeteredStore(inner, Counter()),
    "bench.rendezvous": CountingStore,
}


@pytest.mark.parametrize("wrap", WRAPPERS.values(), ids=WRAPPERS.keys())
async def test_a_wrapper_hands_each_optional_operation_to_the_store_it_wraps(
    wrap: Callable[[Store], Store],
) -> None:
    """Each optional operation reaches the inner store as itself, with the inner's answer."""
    inner = RecordingStore()
    store = wrap(inner)
    assert store.counts_keys
    await store.set("a/1", b"x", ttl=5.0)
    assert await store.multi_set_and_count(["a/2"], [b"y"], prefix="a/") == 2
    count, read = await store.multi_set_count_and_read(["a/3"], [b"z"], prefix="a/", read="a/")
    assert count == 3
    assert sorted(read.items.values()) == [b"x", b"y", b"z"]
    first, second = await store.get_prefixes(["a/", "b/"])
    assert len(first.items) == 3
    assert not second.items
    assert await store.ttl_remaining("a/1") == pytest.approx(5.0, abs=1.0)
    assert inner.called == [
        "multi_set_and_count",
        "multi_set_count_and_read",
        "get_prefixes",
        "ttl_remaining",
    ]


async def test_a_stall_of_get_prefix_holds_a_read_of_several_prefixes_too() -> None:
    """Code that reads two prefixes in one call is held by a test's ``stall("get_prefix")``."""
    store = FaultyStore(MemoryStore())
    reads = store.stall("get_prefix")
    assert reads.matches("get_prefixes")
    reads.release()
    assert not reads.matches("get_prefixes")
