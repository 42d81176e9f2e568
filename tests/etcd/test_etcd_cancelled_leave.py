"""A node cancelled from outside still leaves an etcd rendezvous cleanly (its liveness key goes).

Cancelling a scope around a store's ``async with`` block used to stop the store's own task at
once, before the block's clean-up ran: the handler's goodbye inside it found the store closed
and the node's liveness key stayed for its whole TTL, so the others waited out a heartbeat
timeout for a node that had left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import pytest

from aioelastic.rendezvous import RendezvousHandler, RendezvousParameters, get_rendezvous_handler
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import EtcdStore
from aioelastic.testing import EtcdCluster

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


async def cancelled_once_joined(
    open_handler: Callable[[], AbstractAsyncContextManager[RendezvousHandler]],
) -> None:
    """Join a round with the handler ``open_handler()`` opens, then cancel the node from outside."""
    joined = anyio.Event()

    async def node() -> None:
        async with open_handler() as handler:
            await handler.next_rendezvous()
            joined.set()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(node)
        await joined.wait()
        tg.cancel_scope.cancel()


async def alive_keys(endpoints: str, prefix: str, run_id: str) -> list[str]:
    async with EtcdStore(endpoints, prefix=prefix) as store:
        snapshot = await store.get_prefix(f"rdzv/{run_id}/")
    return sorted(key for key in snapshot.items if key.endswith("/alive"))


async def test_a_cancelled_node_over_its_own_store_deletes_its_liveness_key(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """A handler inside the block of the store it was given: cancelled, it still says goodbye."""
    run_id, endpoints = "cancelled-own-store", etcd_server.endpoints
    settings = ElasticSettings(run_id, 1, 2, last_call_timeout=0.1)

    @asynccontextmanager
    async def handler_over_own_store() -> AsyncIterator[RendezvousHandler]:
        async with (
            EtcdStore(endpoints, prefix=etcd_prefix) as store,
            ElasticRendezvousHandler(store, settings, backend="etcd") as handler,
        ):
            yield handler

    await cancelled_once_joined(handler_over_own_store)
    assert await alive_keys(endpoints, etcd_prefix, run_id) == []


async def test_a_cancelled_node_over_a_store_it_opened_deletes_its_liveness_key(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """A handler from ``get_rendezvous_handler`` (it opens its own store): likewise."""
    run_id, endpoints = "cancelled-opened-store", etcd_server.endpoints
    parameters = RendezvousParameters(
        "etcd",
        endpoints,
        run_id,
        1,
        2,
        local_addr="127.0.0.1",
        last_call_timeout="0.1",
        etcd_prefix=etcd_prefix,
    )

    await cancelled_once_joined(lambda: get_rendezvous_handler(parameters))
    assert await alive_keys(endpoints, etcd_prefix, run_id) == []
