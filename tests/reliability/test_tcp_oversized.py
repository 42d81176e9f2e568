"""Oversized values on the TCP store: a clear error at once, no reconnect storm, nothing lost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from aioelastic.store import StoreValueError, TCPStore, TCPStoreServer

pytestmark = pytest.mark.anyio

LIMIT = 1 << 20


@pytest.mark.parametrize("op", ["set", "append", "compare_set", "multi_set"])
async def test_value_over_the_frame_limit_is_refused_before_sending(op: str) -> None:
    """A value too big for one frame raises StoreValueError; the connection keeps serving."""
    big = b"x" * (LIMIT + 1)
    async with (
        TCPStoreServer(max_frame_size=LIMIT) as server,
        TCPStore("127.0.0.1", server.port, max_frame_size=LIMIT, timeout=30) as store,
    ):
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "set": lambda: store.set("k", big),
            "append": lambda: store.append("k", big),
            "compare_set": lambda: store.compare_set("k", b"", big),
            "multi_set": lambda: store.multi_set(["k", "j"], [b"1", big]),
        }
        with pytest.raises(StoreValueError, match="exceeds the maximum frame size"):
            await calls[op]()
        await store.set("small", b"1")
        assert await store.get("small") == b"1"
        assert await store.check(["k"]) is False
        stats = server.statistics()
    assert (stats.dropped_connections, stats.connections_total) == (0, 1)


@pytest.mark.parametrize("anyio_backend", [("asyncio", {})])
async def test_value_over_a_smaller_server_limit_fails_once() -> None:
    """Against a server with a smaller limit, an oversized set is a StoreValueError at once."""
    async with (
        TCPStoreServer(max_frame_size=LIMIT) as server,
        TCPStore("127.0.0.1", server.port, timeout=2) as store,
    ):
        with anyio.fail_after(60), pytest.raises(StoreValueError, match="frame"):
            await store.set("k", b"x" * (LIMIT + 1))
        stats = server.statistics()
    assert stats.dropped_connections <= 1
