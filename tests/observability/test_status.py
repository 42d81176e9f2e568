"""``aioelastic status``: a run's rendezvous state read from a real TCP store and a real etcd."""

from __future__ import annotations

import json
import socket
import sys
from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

from aioelastic._launcher.cli_status import fetch_status
from aioelastic.agent._report import StackRecord
from aioelastic.agent._stack_requests import RankStack, decode_answer, encode_answer
from aioelastic.agent._stacks import Place
from aioelastic.agent._status import (
    encode_step_times,
    format_learned,
    format_stacks,
    read_step_times,
)
from aioelastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._layout import encode_alive
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.rendezvous._status import (
    NodeStatus,
    RunStatus,
    format_status,
    job_stragglers,
    read_status,
)
from aioelastic.store import TCPStoreServer
from aioelastic.testing import ManualClock, RendezvousCluster

pytestmark = pytest.mark.anyio


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_status_over_tcp_shows_participants_and_a_waiting_node() -> None:
    """After a round of two, a third joiner shows as waiting; ranks and liveness are read."""
    clock = ManualClock()
    async with (
        TCPStoreServer(clock=clock) as server,
        RendezvousCluster(2, min_nodes=2, max_nodes=3, store=server.store, clock=clock) as c,
    ):
        await c.rendezvous()
        late = await c.add_node()
        await c.start_join([late])
        await anyio.wait_all_tasks_blocked()
        status = await fetch_status("c10d", f"127.0.0.1:{server.port}", "test", {}, 10)
    assert (status.round, status.closed, status.nodes_seen) == (1, False, 3)
    assert [(p.rank, p.alive, p.addr) for p in status.participants] == [
        (0, True, "127.0.0.1"),
        (1, True, "127.0.0.1"),
    ]
    assert [(w.node, w.rank) for w in status.waiting] == [(late.handler.node_id, -1)]


async def test_status_shows_a_crashed_participant_as_dead_and_lost() -> None:
    """A crashed member's TTL key expires: status shows it not alive and reported lost."""
    clock = ManualClock()
    async with (
        TCPStoreServer(clock=clock) as server,
        RendezvousCluster(3, min_nodes=2, store=server.store, clock=clock) as cluster,
    ):
        await cluster.rendezvous()
        crashed = cluster.nodes[1]
        await cluster.crash(crashed)
        await cluster.advance(cluster.settings.heartbeat_timeout + 1)
        status = await fetch_status("c10d", f"127.0.0.1:{server.port}", "test", {}, 10)
    dead = [p for p in status.participants if not p.alive]
    assert [p.node for p in dead] == [crashed.handler.node_id]
    assert crashed.handler.node_id in status.lost
    assert "reported lost" in format_status(status)


async def test_status_ages_heartbeats_on_the_store_clock() -> None:
    """A crashed member's heartbeat ages while live members' keep-alives keep theirs fresh."""
    clock = ManualClock()
    async with (
        TCPStoreServer(clock=clock) as server,
        RendezvousCluster(3, min_nodes=2, store=server.store, clock=clock) as cluster,
    ):
        await cluster.rendezvous()
        interval = cluster.settings.keep_alive_interval
        await cluster.advance(interval - clock.now() % interval)  # just after a keep-alive
        fresh = await fetch_status("c10d", f"127.0.0.1:{server.port}", "test", {}, 10)
        crashed = cluster.nodes[1]
        await cluster.crash(crashed)
        await cluster.advance(interval * 1.5)
        status = await fetch_status("c10d", f"127.0.0.1:{server.port}", "test", {}, 10)
    assert [p.heartbeat_age for p in fresh.participants] == [0.0, 0.0, 0.0]
    ages = {p.node: p.heartbeat_age for p in status.participants}
    crashed_id = crashed.handler.node_id
    assert ages[crashed_id] == pytest.approx(interval * 1.5)
    assert all(age == pytest.approx(interval / 2) for n, age in ages.items() if n != crashed_id)
    assert f"{interval * 1.5:.0f}s ago" in format_status(status)


async def test_status_of_an_unreachable_store_names_it() -> None:
    """No server at the endpoint: a RendezvousConnectionError naming the address."""
    port = unused_port()
    with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{port}"):
        await fetch_status("c10d", f"127.0.0.1:{port}", "test", {}, 1)


@pytest.mark.etcd
async def test_status_over_etcd(anyio_backend: Any, etcd_server: Any, etcd_prefix: str) -> None:
    """Two handlers over a real etcd form a round; status reads it through the etcd backend."""
    if anyio_backend[0] != "asyncio":
        pytest.skip("EtcdStore is asyncio-only (grpc.aio does not run on trio)")
    from aioelastic.store import EtcdStore

    settings = ElasticSettings.from_parameters(RendezvousParameters("etcd", "", "job", 2, 2))
    async with (
        EtcdStore(etcd_server.endpoints, prefix=etcd_prefix, timeout=30) as store,
        AsyncExitStack() as stack,
    ):
        handlers = [
            await stack.enter_async_context(
                ElasticRendezvousHandler(store, settings, backend="etcd", local_addr="10.0.0.1")
            )
            for _ in range(2)
        ]
        async with anyio.create_task_group() as tg:
            for handler in handlers:
                tg.start_soon(handler.next_rendezvous)
        conf = {"etcd_prefix": etcd_prefix}
        status = await fetch_status("etcd", etcd_server.endpoints, "job", conf, 10)
    assert status.round == 1
    assert [(p.rank, p.addr, p.alive) for p in status.participants] == [
        (0, "10.0.0.1", True),
        (1, "10.0.0.1", True),
    ]
    for participant in status.participants:
        assert participant.heartbeat_age is not None
        assert 0 <= participant.heartbeat_age <= settings.heartbeat_timeout


def test_an_empty_run_says_nobody_joined() -> None:
    """A run id with no keys reads as round 0 with a hint to check the id."""
    status = read_status("nobody", {})
    assert status == RunStatus("nobody", 0, False, (), (), {}, 0)
    assert "check --rdzv-id" in format_status(status)


def test_a_closed_run_reads_as_closed() -> None:
    """The close marker and a closed result read as a closed run without participants."""
    status = read_status("job", {"state/closed": b"1", "state/latest": b"0"})
    assert status.closed
    assert format_status(status).startswith("run 'job': round 0, closed")


def test_the_table_lists_ranks_then_waiting_nodes() -> None:
    """format_status prints one line per participant, then one per waiting node."""
    status = RunStatus(
        "job",
        2,
        False,
        (NodeStatus(4, 0, "a", True, 3.0, 12.0), NodeStatus(2, 1, "b", False)),
        (NodeStatus(7, -1, "c", True, 1.0, 14.0),),
        {},
        8,
    )
    lines = format_status(status).splitlines()
    assert "last heartbeat" in lines[1]
    assert lines[2].split() == ["0", "4", "yes", "3s", "ago", "a"]
    assert lines[3].split() == ["1", "2", "NO", "-", "b"]
    assert lines[4].split() == ["wait", "7", "yes", "1s", "ago", "c"]


async def test_the_status_command_prints_json_from_a_live_server() -> None:
    """`aioelastic status --json` in a subprocess reads a live TCP store and exits 0."""
    async with TCPStoreServer() as server:
        result = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "aioelastic",
                "status",
                "--rdzv-endpoint",
                f"127.0.0.1:{server.port}",
                "--rdzv-id",
                "empty",
                "--json",
            ],
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["round"] == 0


async def test_status_without_a_source_says_what_to_give() -> None:
    """Neither a store nor a node to read: exit 2 with one line naming the flags."""
    result = await anyio.run_process([sys.executable, "-m", "aioelastic", "status"], check=False)
    assert result.returncode == 2
    assert b"give --rdzv-endpoint (and --rdzv-id), --timers, or both" in result.stderr


WAITING_NODE_3 = {"state/latest": b"0", "round/1/join/3": b'["h", 1, 0, -1]'}


def test_a_liveness_value_without_its_ttl_shows_the_time_left() -> None:
    """An alive key that does not record its TTL shows the TTL left instead of an age."""
    items = {**WAITING_NODE_3, "node/3/alive": b"1"}
    status = read_status("job", items, {3: 12.0})
    (node,) = status.waiting
    assert (node.alive, node.heartbeat_age, node.heartbeat_left) == (True, None, 12.0)
    assert "(12s left)" in format_status(status)


def test_heartbeat_age_is_the_recorded_ttl_minus_the_time_left() -> None:
    """A liveness value written with ttl=15 and 11 s left was refreshed 4 s ago."""
    items = {**WAITING_NODE_3, "node/3/alive": encode_alive(15)}
    (node,) = read_status("job", items, {3: 11.0}).waiting
    assert node.heartbeat_age == pytest.approx(4.0)


def test_learned_timeouts_are_a_table_by_scope() -> None:
    """`status --timers` shows each scope's learned limit, longest block and block count."""
    learned = {"step": {"limit": 90.0, "observations": 12, "longest": 30.0}}
    assert format_learned("n:1", learned).splitlines() == [
        "node n:1: learned timeouts",
        "  limit (s)  longest (s)  blocks  scope",
        "       90.0         30.0      12  step",
    ]
    assert format_learned("n:1", {}) == "node n:1: no learned timeout yet"


def test_stack_answers_group_into_one_table() -> None:
    """`status --stacks`: every node's answer (through the store's JSON) grouped, suspects
    named, each rank's place and its stack file on its host."""
    from aioelastic.agent._status import stacks_data

    def rank(number: int, place: Place | None, path: str | None) -> RankStack:
        record = StackRecord(number, 100 + number, "py-spy" if path else None, path, None)
        return RankStack(record, place)

    waiting = Place(True, "all_reduce")
    node0 = encode_answer([rank(0, waiting, "/s/rank0.txt"), rank(1, waiting, "/s/rank1.txt")], "a")
    node1 = encode_answer([rank(2, Place(False, "data.py:88 load"), "/s/rank2.txt")], "b")
    data = stacks_data({0: decode_answer(node0), 1: decode_answer(node1)}, silent=[2])
    assert format_stacks("job", data).splitlines() == [
        "run 'job' stacks: rank 2 stuck in data.py:88 load; ranks 0 and 1 waiting in all_reduce",
        "  suspects: 2",
        "  no answer from node(s): 2",
        "  rank  node      pid  place / stack file",
        "     0     0      100  waiting in all_reduce",
        "                       a:/s/rank0.txt",
        "     1     0      101  waiting in all_reduce",
        "                       a:/s/rank1.txt",
        "     2     1      102  stuck in data.py:88 load",
        "                       b:/s/rank2.txt",
    ]


def test_each_nodes_step_times_read_back_and_name_the_jobs_stragglers() -> None:
    """Nodes show their ranks' median step times; status scores them job-wide and names the
    ranks slower than the factor times the fastest rank of any node."""
    items = {
        "store/3/aioelastic/agent/steps/0": encode_step_times(10.0, {0: 0.1, 1: 0.11}, 1 / 0.75),
        "store/3/aioelastic/agent/steps/1": encode_step_times(10.5, {2: 0.3, 3: 0.1}, 1 / 0.75),
        "store/3/aioelastic/agent/steps/2": b"not json",
        "store/2/aioelastic/agent/steps/0": encode_step_times(1.0, {0: 9.0}, 1 / 0.75),
    }
    steps = read_step_times(items, 3)
    assert [(s.group_rank, dict(s.medians)) for s in steps] == [
        (0, {0: 0.1, 1: 0.11}),
        (1, {2: 0.3, 3: 0.1}),
    ]
    assert job_stragglers(steps) == {2: pytest.approx(1 / 3)}
    status = RunStatus("job", 3, False, (), (), {}, 2, step_times=steps)
    lines = format_status(status).splitlines()
    assert (
        "median step time (ms) by rank, last window: 0: 100.0, 1: 110.0, 2: 300.0, 3: 100.0"
        in (lines[1])
    )
    assert lines[2] == "  stragglers: rank 2 (score 0.33)"


def test_without_step_marks_status_says_nothing_of_step_times() -> None:
    """A run whose workers mark no step shows no step-time lines."""
    assert "step time" not in format_status(RunStatus("job", 1, False, (), (), {}, 1))
