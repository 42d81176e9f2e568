"""A node cancelled from outside still leaves an etcd rendezvous cleanly (its liveness key goes).

Cancelling a scope around a store's ``async with`` block used to stop the store's own task at
once, before the block's clean-up ran: the handler's goodbye inside it found the store closed
and the node's liveness key stayed for its whole TTL, so the others waited out a heartbeat
timeout for a node that had left.
"""

from __future__ import annotations

import anyio
import pytest

from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import EtcdStore
from aioelastic.testing import EtcdCluster

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


async def alive_keys(store: EtcdStore, run_id: str) -> list[str]:
    snapshot = await store.get_prefix(f"rdzv/{run_id}/")
    return sorted(key for key in snapshot.items if key.endswith("/alive"))


async def cancel_once_joined(node: object) -> None:
    """Run ``node(joined)`` in a task group and cancel the group once it has joined."""
    joined = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(node, joined)  # type: ignore[arg-type]
        await joined.wait()
        tg.cancel_scope.cancel()


async def test_a_cancelled_node_over_its_own_store_deletes_its_liveness_key(
    etcd_server: EtcdCluster, etcd_prefix: str
) -> None:
    """A handler inside the block of the store it was given: cancelled, it still says goodbye."""
    run_id, endpoints = "cancelled-own-store", etcd_server.endpoints
    settings = ElasticSettings(run_id, 1, 2, last_call_timeout=0.1)

    async def node(joined: anyio.Event) -> None:
        async with (
            EtcdStore(endpoints, prefix=etcd_prefix) as store,
            ElasticRendezvousHandler(store, settings, backend="etcd") as handler,
        ):
            await handler.next_rendezvous()
            joined.set()
            await anyio.sleep_forever()

    async with EtcdStore(endpoints, prefix=etcd_prefix) as admin:
        await cancel_once_joined(node)
        assert await alive_keys(admin, run_id) == []


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

    async def node(joined: anyio.Event) -> None:
        async with get_rendezvous_handler(parameters) as handler:
            await handler.next_rendezvous()
            joined.set()
            await anyio.sleep_forever()

    async with EtcdStore(endpoints, prefix=etcd_prefix) as admin:
        await cancel_once_joined(node)
        assert await alive_keys(admin, run_id) == []
