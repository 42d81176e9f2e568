"""The c10d and static backends over a real TCP store server, in one process."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

from aioelastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameterError,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousTimeoutError,
    get_rendezvous_handler,
)
from aioelastic.rendezvous._c10d import parse_endpoint

pytestmark = pytest.mark.anyio


def unused_port() -> int:
    """A free port below the ephemeral range, so no outgoing connection takes it meanwhile."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def params(backend: str, port: int, size: tuple[int, int], **config: Any) -> RendezvousParameters:
    return RendezvousParameters(backend, f"127.0.0.1:{port}", "job", *size, **config)


async def join_all(handlers: Sequence[RendezvousHandler]) -> list[RendezvousInfo]:
    """Enter the handlers in order (the first hosts the store) and join them concurrently."""
    infos: dict[int, RendezvousInfo] = {}
    async with AsyncExitStack() as stack:
        for handler in handlers:
            await stack.enter_async_context(handler)
        async with anyio.create_task_group() as tg:
            for index, handler in enumerate(handlers):

                async def join(index: int = index, handler: RendezvousHandler = handler) -> None:
                    infos[index] = await handler.next_rendezvous()

                tg.start_soon(join)
    return [infos[i] for i in range(len(handlers))]


async def test_c10d_nodes_form_a_round_over_a_hosted_tcp_store() -> None:
    """The first c10d node hosts the store on its local endpoint; max_nodes complete at once."""
    port = unused_port()
    handlers = [get_rendezvous_handler(params("c10d", port, (2, 3))) for _ in range(3)]
    infos = await join_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1, 2]
    assert {info.world_size for info in infos} == {3}
    assert len({info.bootstrap_store_info for info in infos}) == 1
    assert not handlers[0].use_agent_store


async def test_c10d_round_store_is_shared_by_the_round() -> None:
    """info.store is one store for the round: what rank 0 writes, the others read."""
    port = unused_port()
    handlers = [get_rendezvous_handler(params("c10d", port, (2, 2))) for _ in range(2)]
    async with handlers[0], handlers[1]:
        async with anyio.create_task_group() as tg:
            infos: list[RendezvousInfo] = []
            for handler in handlers:
                tg.start_soon(_append_next, handler, infos)
        writer, reader = sorted(infos, key=lambda info: info.rank)
        await writer.store.set("greeting", "hello")
        assert await reader.store.get("greeting", timeout=10) == b"hello"


async def _append_next(handler: RendezvousHandler, infos: list[RendezvousInfo]) -> None:
    infos.append(await handler.next_rendezvous())


async def test_c10d_unreachable_store_is_a_connection_error() -> None:
    """A non-host node that cannot reach the endpoint fails with a message naming it."""
    port = unused_port()
    handler = get_rendezvous_handler(
        params("c10d", port, (1, 2), is_host="false", read_timeout="0.3")
    )
    with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{port}"):
        async with handler:
            pass


async def test_c10d_host_on_a_busy_port_says_what_to_do() -> None:
    """A node told to host the store, on a port another process holds, fails naming the port."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        handler = get_rendezvous_handler(params("c10d", port, (1, 2), is_host="true"))
        with pytest.raises(
            RendezvousConnectionError,
            match=f"cannot serve the rendezvous store on 127.0.0.1:{port}: .*free the port",
        ):
            async with handler:
                pass


async def test_static_nodes_get_their_configured_ranks() -> None:
    """Static: rank from the config, one master for everyone, fixed world size."""
    port = unused_port()
    handlers = [get_rendezvous_handler(params("static", port, (3, 3), rank=r)) for r in range(3)]
    infos = await join_all(handlers)
    assert [info.rank for info in infos] == [0, 1, 2]
    assert {info.world_size for info in infos} == {3}
    assert len({info.bootstrap_store_info for info in infos}) == 1


async def test_static_restart_starts_the_next_attempt_with_every_node() -> None:
    """A node's restart ends the others' round; every node then starts attempt 1 together, in
    a keyspace of its own, after rank 0 deleted what the last attempt's workers wrote at the
    root (torch's clients share it): no new worker can read an old worker's address."""
    port = unused_port()
    handlers = [get_rendezvous_handler(params("static", port, (2, 2), rank=r)) for r in range(2)]
    async with AsyncExitStack() as stack:
        for handler in handlers:
            await stack.enter_async_context(handler)
        joined: dict[int, RendezvousInfo] = {}
        async with anyio.create_task_group() as tg:
            for rank, handler in enumerate(handlers):

                async def join(rank: int = rank, handler: RendezvousHandler = handler) -> None:
                    joined[rank] = await handler.next_rendezvous()

                tg.start_soon(join)
        first = joined[0]
        torch_store = handlers[1]._root  # type: ignore[attr-defined]  # what torch's clients see
        await torch_store.set("default_pg/0//cpu//rank_0", b"old worker's address")
        restarted: dict[int, RendezvousInfo] = {}
        invalidated = []
        async with anyio.create_task_group() as tg:

            async def node_1() -> None:
                restarted[1] = await handlers[1].next_rendezvous()  # its worker failed

            async def node_0() -> None:
                invalidated.append(await handlers[0].wait_round_invalidated())
                restarted[0] = await handlers[0].next_rendezvous()

            tg.start_soon(node_1)
            tg.start_soon(node_0)
        assert [event.reason.name for event in invalidated] == ["RESTARTING"]
        assert not await torch_store.check(["default_pg/0//cpu//rank_0"])
        assert [restarted[r].round for r in (0, 1)] == [1, 1]
        await restarted[0].store.set("slot", b"attempt 1")
        assert await restarted[1].store.get("slot") == b"attempt 1"
        assert not await first.store.check(["slot"])


async def test_static_duplicate_rank_is_refused() -> None:
    """Two static nodes claiming one rank: one of them is told to fix its rank."""
    port = unused_port()
    host, first, second = (
        get_rendezvous_handler(params("static", port, (3, 3), rank=r)) for r in (0, 1, "1")
    )
    refused = anyio.Event()
    errors: list[Exception] = []

    async def join(handler: RendezvousHandler) -> None:
        try:
            await handler.next_rendezvous()
        except RendezvousStateError as error:
            errors.append(error)
            refused.set()

    async with host, first, second, anyio.create_task_group() as tg:
        tg.start_soon(join, first)
        tg.start_soon(join, second)
        with anyio.fail_after(10):
            await refused.wait()
        tg.cancel_scope.cancel()
    assert len(errors) == 1
    with pytest.raises(RendezvousStateError, match="rank 1 of run 'job' is already taken"):
        raise errors[0]


async def test_static_missing_ranks_time_out_with_counts() -> None:
    """A static node alone times out naming how many of the ranks arrived."""
    port = unused_port()
    handler = get_rendezvous_handler(params("static", port, (2, 2), rank=0, timeout="0.2"))
    async with handler:
        with pytest.raises(RendezvousTimeoutError, match=r"1 live node\(s\) joined, 2 needed"):
            await handler.next_rendezvous()


@pytest.mark.parametrize(
    ("size", "config", "message"),
    [
        ((1, 2), {"rank": 0}, "needs a fixed size"),
        ((2, 2), {}, "needs rank=0..1"),
        ((2, 2), {"rank": 5}, "needs rank=0..1"),
        ((2, 2), {"rank": 0, "last_call_timeout": 3}, "unknown rendezvous option"),
    ],
)
def test_static_bad_configs_are_refused(
    size: tuple[int, int], config: dict[str, Any], message: str
) -> None:
    """Static backend configuration errors say what to change."""
    with pytest.raises(RendezvousParameterError, match=message):
        get_rendezvous_handler(params("static", 29400, size, **config))


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("node1:1234", ("node1", 1234)),
        ("node1", ("node1", 29400)),
        ("[::1]:99", ("::1", 99)),
        ("::1", ("::1", 29400)),
    ],
)
def test_endpoints_parse(endpoint: str, expected: tuple[str, int]) -> None:
    """host[:port] and [v6]:port endpoints parse; the default port is 29400."""
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize(
    "endpoint", ["", "host:http", "host:0", "host:70000", ":29400", "[::1", "[::1]x", "[]:5"]
)
def test_bad_endpoints_are_refused(endpoint: str) -> None:
    """An empty endpoint or host, a bad port or a malformed [v6] is a parameter error."""
    with pytest.raises(RendezvousParameterError, match="endpoint"):
        parse_endpoint(endpoint)


async def test_losing_the_store_ends_the_round_as_store_lost() -> None:
    """When the store server goes away (its port refuses), the members' round ends as
    STORE_LOST naming the store's host, not FENCED once the lease lapses."""
    from aioelastic.rendezvous import InvalidationReason
    from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
    from aioelastic.rendezvous._parameters import ElasticSettings
    from aioelastic.store import TCPStore, TCPStoreServer

    settings = ElasticSettings(
        "job", 2, 2, close_timeout=5, heartbeat_timeout=3, keep_alive_interval=1
    )
    server = TCPStoreServer("127.0.0.1", 0)
    server_scope = anyio.CancelScope()

    async def serve(*, task_status: anyio.abc.TaskStatus[int]) -> None:
        with server_scope:
            await server.serve(task_status=task_status)

    async with anyio.create_task_group() as outer, AsyncExitStack() as stack:
        port = await outer.start(serve)
        handlers = []
        for _ in range(2):
            client = TCPStore("127.0.0.1", port, connect_timeout=0.5)
            await stack.enter_async_context(client)
            handler = ElasticRendezvousHandler(
                client, settings, backend="c10d", local_addr="127.0.0.1"
            )
            handlers.append(await stack.enter_async_context(handler))
        async with anyio.create_task_group() as tg:
            for handler in handlers:
                tg.start_soon(handler.next_rendezvous)
        server_scope.cancel()
        with anyio.fail_after(30):  # generous: only guards against a hang
            verdicts = [await handler.wait_round_invalidated() for handler in handlers]
    assert {verdict.reason for verdict in verdicts} == {InvalidationReason.STORE_LOST}
    assert "the store's host was lost (it left or died)" in verdicts[0].detail
    assert "refused" in verdicts[0].detail
