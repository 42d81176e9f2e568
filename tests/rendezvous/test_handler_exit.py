"""Leaving a handler: its own tasks end even when the goodbye fails in a way it cannot handle."""

from __future__ import annotations

import anyio
import pytest

from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import MemoryStore

pytestmark = pytest.mark.anyio


class BrokenGoodbye(MemoryStore):
    """A store whose delete_key fails with an error the handler does not expect."""

    async def delete_key(self, key: str) -> bool:
        raise RuntimeError(f"cannot delete {key!r}")


async def test_a_failed_goodbye_still_ends_the_handlers_tasks() -> None:
    """The goodbye's error reaches the caller, and the handler's keep-alive task group is left
    first (not left open, which would break the caller's own cancel scopes)."""
    handler = ElasticRendezvousHandler(
        BrokenGoodbye(), ElasticSettings("exit", 1, 1), backend="test", local_addr="127.0.0.1"
    )
    with anyio.CancelScope():  # the caller's own scope: leaving it must still work
        with pytest.raises(RuntimeError, match="cannot delete 'rdzv/exit/node/1/alive'"):
            async with handler:
                pass
    assert handler.statistics().node == 1
