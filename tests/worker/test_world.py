"""``aioelastic.worker`` against a stand-in agent: the other end of a real socket pair."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

from aioelastic import worker
from aioelastic.store import BlockingTCPStore, Store, StoreClosedError, TCPStoreServer
from aioelastic.worker import _protocol as p
from aioelastic.worker import _world


class Agent:
    """The agent's end of a worker's link: what the worker said, and saying things to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = p.LineDecoder()

    def say(self, *messages: p.Message) -> None:
        for message in messages:
            self.sock.sendall(p.encode(message))

    def heard(self) -> list[p.Message]:
        self.sock.setblocking(False)
        try:
            return self.decoder.feed(self.sock.recv(65536))
        except BlockingIOError:
            return []
        finally:
            self.sock.setblocking(True)


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    ours, theirs = socket.socketpair()
    monkeypatch.setenv(p.WORKER_FD_ENV, str(theirs.detach()))
    monkeypatch.setattr(_world, "_LINK", None)
    environment = dict(os.environ)  # worlds() writes each world's ranks there
    yield Agent(ours)
    os.environ.clear()
    os.environ.update(environment)
    ours.close()
    if _world._LINK is not None:
        _world._LINK.close()


def place(generation: int, rank: int = 0, **changes: object) -> p.WorldAssigned:
    values: dict[str, object] = {
        "generation": generation,
        "rank": rank,
        "world_size": 2,
        "local_rank": rank,
        "is_fresh": False,
        "source_rank": 0,
        "fresh_ranks": (),
        "store": {"kind": "file", "path": "/nonexistent"},
        "timeout": 30.0,
    }
    values.update(changes)
    return p.WorldAssigned(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message",
    [
        p.Hello(12),
        p.Enter(3),
        p.Trouble(3, "RuntimeError: reset"),
        place(4, 1, is_fresh=True, fresh_ranks=(1,)),
        p.WorldEnded(4, "rank 1 failed"),
        p.StillValid(4),
        p.NoMoreWorlds("the job finished"),
    ],
)
def test_messages_survive_the_wire(message: p.Message) -> None:
    """Every message decodes to what was encoded, even when split across reads."""
    decoder = p.LineDecoder()
    line = p.encode(message)
    assert decoder.feed(line[:5]) == []
    assert decoder.feed(line[5:]) == [message]


@pytest.mark.parametrize("line", [b"not json\n", b'{"kind": "Nope"}\n', b'{"kind": "Enter"}\n'])
def test_a_bad_line_is_a_link_protocol_error(line: bytes) -> None:
    """What is not a message of the link is refused with the line quoted."""
    with pytest.raises(p.LinkProtocolError, match="not a message of the agent-worker link"):
        p.LineDecoder().feed(line)


def test_without_an_agent_one_world_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside in-place recovery, worlds() yields one world with torch's variables."""
    monkeypatch.delenv(p.WORKER_FD_ENV, raising=False)
    monkeypatch.setattr(_world, "_LINK", None)
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    found = list(worker.worlds())
    assert [(w.rank, w.world_size, w.local_rank, w.generation) for w in found] == [(3, 4, 1, 3)]
    assert not found[0].is_fresh
    found[0].check()  # no agent: never ends


def test_the_worker_says_hello_and_gets_its_world(agent: Agent) -> None:
    """worlds() says hello, yields the assigned world and tells the agent when it enters."""
    agent.say(place(1, 1, is_fresh=True, fresh_ranks=(1,), source_rank=0))
    worlds = worker.worlds()
    world = next(worlds)
    assert (world.generation, world.rank, world.is_fresh, world.fresh_ranks) == (1, 1, True, (1,))
    with world:
        pass
    assert [type(m) for m in agent.heard()] == [p.Hello, p.Enter]
    assert list(worlds) == []  # left normally: the training is over


def test_each_world_puts_its_ranks_in_torchs_variables(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare started with RANK=-1 finds its place's ranks in its environment once placed."""
    for name, value in {"RANK": "-1", "LOCAL_RANK": "-1", "AIOELASTIC_SPARE": "1"}.items():
        monkeypatch.setenv(name, value)
    agent.say(place(3, 1, world_size=4))
    next(worker.worlds())
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
    assert [os.environ[name] for name in names] == ["1", "1", "4", "1", "4"]
    assert "AIOELASTIC_SPARE" not in os.environ


def test_check_raises_once_the_world_ended_and_with_world_goes_on(agent: Agent) -> None:
    """WorldEnded makes check() raise WorldChanged; with world swallows it; the next comes."""
    agent.say(place(1))
    worlds = worker.worlds()
    first = next(worlds)
    with first:
        first.check()
        agent.say(p.WorldEnded(1, "rank 1 failed"), place(2))
        with pytest.raises(worker.WorldChanged, match="generation 1 of the world ended: rank 1"):
            first.check()
        first.check()
    second = next(worlds)
    assert second.generation == 2
    assert first.ended == "rank 1 failed"


def test_an_error_of_an_ended_world_is_swallowed(agent: Agent) -> None:
    """A collective's error after the agent ended the world leaves the world quietly."""
    agent.say(place(1))
    worlds = worker.worlds()
    with next(worlds):
        agent.say(p.WorldEnded(1, "rank 0 failed"), place(2))
        raise RuntimeError("Connection reset by peer")
    assert next(worlds).generation == 2


def test_an_error_of_a_valid_world_propagates_after_asking(agent: Agent) -> None:
    """The worker's own error: it asks the agent, hears StillValid, and the error propagates."""
    agent.say(place(1))
    world = next(worker.worlds())
    agent.say(p.StillValid(1))
    with pytest.raises(ValueError, match="own bug"), world:
        raise ValueError("own bug")
    said = agent.heard()
    assert said[-1] == p.Trouble(1, "ValueError: own bug")


def test_a_rank_that_asks_late_gets_the_world_in_force(agent: Agent) -> None:
    """Generations 1 and 2 came and went before this rank asked (a slow start): its first world
    is generation 3, and it enters none that ended."""
    agent.say(place(1), place(2, world_size=3), p.WorldEnded(1, "rank 1 failed"))
    agent.say(place(3, world_size=2))
    worlds = worker.worlds()
    first = next(worlds)
    assert (first.generation, first.world_size) == (3, 2)
    with first:
        first.check()
    assert [type(m) for m in agent.heard()] == [p.Hello, p.Enter]


def test_no_more_worlds_ends_the_loop_of_a_waiting_spare(agent: Agent) -> None:
    """A spare that is never needed leaves worlds() when the job finishes."""
    agent.say(p.NoMoreWorlds("the job finished"))
    assert list(worker.worlds()) == []


def test_a_gone_agent_is_an_agent_link_error(agent: Agent) -> None:
    """The link closing while the worker waits for a world is reported, not a hang."""
    agent.sock.close()
    with pytest.raises(worker.AgentLinkError, match=r"closed the link|gone"):
        next(worker.worlds())


@pytest.mark.anyio
async def test_the_async_twin_waits_on_the_loop(agent: Agent) -> None:
    """async_worlds() and async with world behave as the sync ones; wait_changed() wakes."""
    agent.say(place(1))
    worlds = worker.async_worlds()
    first = await anext(worlds)
    async with first:
        agent.say(p.WorldEnded(1, "node 1 was lost"), place(2))
        changed = await first.wait_changed()
        assert changed.reason == "node 1 was lost"
        raise changed
    second = await anext(worlds)
    assert second.generation == 2
    await worlds.aclose()


@pytest.mark.anyio
async def test_without_torch_async_with_opens_an_async_store(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async worker without torch gets an async store of its generation from async with,
    closed on leaving it."""
    monkeypatch.setattr(_world, "_has_torch", lambda: False)
    async with TCPStoreServer() as server:
        store = {"kind": "tcp", "host": "127.0.0.1", "port": server.port, "prefix": "w/gen1"}
        agent.say(place(1, store=store))
        worlds = worker.async_worlds()
        world = await anext(worlds)
        async with world:
            assert isinstance(world.store, Store)
            await world.store.set("ready", b"yes")
        assert await server.store.get("w/gen1/ready") == b"yes"
        with pytest.raises(StoreClosedError):
            await world.store.get("ready")
        await worlds.aclose()


@pytest.mark.anyio
async def test_an_async_wait_in_a_world_that_ends_leaves_the_world(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async worker awaiting world.store.get() for a dead peer's key gets out when the world
    ends (WorldChanged, swallowed by async with), while another task waits on the same world;
    the server holds no wait afterwards."""
    monkeypatch.setattr(_world, "_has_torch", lambda: False)
    async with TCPStoreServer() as server:
        spec = {"kind": "tcp", "host": "127.0.0.1", "port": server.port, "prefix": "w/gen1"}
        agent.say(place(1, store=spec))
        worlds = worker.async_worlds()
        world = await anext(worlds)
        changes: list[worker.WorldChanged] = []
        async with anyio.create_task_group() as tg:

            async def watcher() -> None:
                changes.append(await world.wait_changed())

            async def ender() -> None:
                with anyio.fail_after(10):
                    while not server.statistics().waiting_requests:  # the get is parked
                        await anyio.wait_all_tasks_blocked()
                agent.say(p.WorldEnded(1, "rank 1 failed"))

            tg.start_soon(watcher)
            tg.start_soon(ender)
            async with world:
                await world.store.get("from-the-dead-peer", timeout=60)
        assert [change.reason for change in changes] == ["rank 1 failed"]
        assert world.ended == "rank 1 failed"
        with anyio.fail_after(10):
            while server.statistics().waiting_requests:
                await anyio.wait_all_tasks_blocked()
        await worlds.aclose()


@pytest.fixture
def served() -> Iterator[TCPStoreServer]:
    """A TCP store server in a thread of its own (the test's blocking calls block only it)."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(TCPStoreServer()) as server,
    ):
        yield server


def tcp(server: TCPStoreServer, generation: int) -> dict[str, object]:
    return {"kind": "tcp", "host": "127.0.0.1", "port": server.port, "prefix": f"w/gen{generation}"}


def test_without_torch_a_sync_world_has_a_blocking_store_of_its_generation(
    agent: Agent, served: TCPStoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """world.store is a BlockingTCPStore view under the generation's prefix; the next
    generation's view uses the same connection; leaving a world closes its view."""
    monkeypatch.setattr(_world, "_has_torch", lambda: False)
    agent.say(place(1, store=tcp(served, 1)))
    worlds = worker.worlds()
    first = next(worlds)
    with first:
        first.store.set("k", b"one")
        agent.say(p.WorldEnded(1, "rank 1 failed"), place(2, store=tcp(served, 2)))
        first.check()
    with pytest.raises(StoreClosedError):
        first.store.get("k")
    second = next(worlds)
    with second:
        store = second.store
        assert isinstance(store, BlockingTCPStore)
        assert store.endpoint.endswith("under 'w/gen2/'")
        assert store.check(["k"]) is False  # generation 1's key is not in generation 2's store
        store.set("k", b"two")
        assert store.get_prefix("").items == {"k": b"two"}
        assert _world._BLOCKING_STORES[("127.0.0.1", served.port)] is not None
        assert len(_world._BLOCKING_STORES) == 1  # one connection for both generations
    assert list(worlds) == []
    assert _world._BLOCKING_STORES == {}  # the loop ended: its connection is closed


def test_a_wait_in_a_world_that_ends_leaves_the_world(
    agent: Agent, served: TCPStoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync worker blocked in world.store.get() for a peer that died gets out when the agent
    ends the world: the get raises WorldChanged, with world swallows it, the next world comes
    and uses the same connection."""
    monkeypatch.setattr(_world, "_has_torch", lambda: False)
    agent.say(place(1, store=tcp(served, 1)))
    worlds = worker.worlds()
    first = next(worlds)
    ender = threading.Timer(
        0.2, agent.say, (p.WorldEnded(1, "rank 1 failed"), place(2, store=tcp(served, 2)))
    )
    with first:
        ender.start()
        first.store.get("from-the-dead-peer", timeout=60)
    ender.join()
    assert first.ended == "rank 1 failed"
    connection = _world._BLOCKING_STORES[("127.0.0.1", served.port)]
    with next(worlds) as second:
        second.store.set("k", b"v")
        assert _world._BLOCKING_STORES[("127.0.0.1", served.port)] is connection


def test_a_broken_connection_is_not_reused_by_the_next_generation(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the store's connection broke (its server restarted), the next world opens a new one."""
    monkeypatch.setattr(_world, "_has_torch", lambda: False)
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(TCPStoreServer()) as server:
            agent.say(place(1, store=tcp(server, 1)))
            worlds = worker.worlds()
            with next(worlds) as first:
                first.store.set("k", b"v")
            port = server.port
        with portal.wrap_async_context_manager(TCPStoreServer(port=port)) as again:
            agent.say(p.WorldEnded(1, "node 1 was lost"), place(2, store=tcp(again, 2)))
            second = next(worlds)
            with second:
                second.store.set("k", b"w")
            assert portal.call(again.store.get, "w/gen2/k") == b"w"
        worlds.close()


def test_without_torch_nor_an_agent_store_the_error_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside aioelastic run, with no store to join and no torch to host one: a clear error."""
    monkeypatch.delenv(p.WORKER_FD_ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(_world, "_LINK", None)
    monkeypatch.setattr(_world, "_has_torch", lambda: False)
    world = next(worker.worlds())
    with pytest.raises(worker.AgentLinkError, match="run under `aioelastic run`"):
        _ = world.store
