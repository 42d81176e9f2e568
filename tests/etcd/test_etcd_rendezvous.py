"""The etcd rendezvous backend on a real etcd: forming rounds, member failures, lost nodes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import grpc
import pytest
from aetcd import rpc
from anyio.streams.buffered import BufferedByteReceiveStream

from aioelastic.rendezvous import (
    InvalidationReason,
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousParameterError,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import EtcdStore
from aioelastic.testing import EtcdCluster

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]

# Real etcd members and processes die in these tests: one event loop is enough.
one_loop = pytest.mark.parametrize("anyio_backend", [("asyncio", {})], ids=["asyncio"])

FAST_LIVENESS = {"keep_alive_interval": "1", "heartbeat_timeout": "3"}


def params(endpoints: str, run_id: str, nodes: int, **config: Any) -> RendezvousParameters:
    return RendezvousParameters(
        "etcd", endpoints, run_id, nodes, nodes, local_addr="127.0.0.1", **config
    )


async def form(handlers: list[RendezvousHandler]) -> list[tuple[int, int]]:
    """Run next_rendezvous on every handler at once; return their (rank, world size)."""
    results: list[tuple[int, int]] = []

    async def one(handler: RendezvousHandler) -> None:
        info = await handler.next_rendezvous()
        results.append((info.rank, info.world_size))

    async with anyio.create_task_group() as tg:
        for handler in handlers:
            tg.start_soon(one, handler)
    return sorted(results)


@pytest.mark.parametrize("backend", ["etcd", "etcd-v3", "etcd-v2"])
@one_loop
async def test_nodes_form_a_round(etcd_server: EtcdCluster, backend: str) -> None:
    """Three handlers on etcd get ranks 0..2 of a world of 3, under either backend name."""
    run = f"form-{backend}"
    handlers = [
        get_rendezvous_handler(
            RendezvousParameters(backend, etcd_server.endpoints, run, 3, 3, local_addr="127.0.0.1")
        )
        for _ in range(3)
    ]
    async with handlers[0], handlers[1], handlers[2]:
        assert await form(handlers) == [(0, 3), (1, 3), (2, 3)]
        assert {h.get_backend() for h in handlers} == {backend}


@one_loop
async def test_handlers_can_share_one_store(etcd_server: EtcdCluster) -> None:
    """Handlers given one open EtcdStore (config ``store``) form a round over it."""
    endpoints = etcd_server.endpoints
    async with EtcdStore(endpoints, prefix="/aioelastic/") as store:
        shared = params(endpoints, "shared", 3, store=store)
        handlers = [get_rendezvous_handler(shared) for _ in "abc"]
        async with handlers[0], handlers[1], handlers[2]:
            assert await form(handlers) == [(0, 3), (1, 3), (2, 3)]
        assert store.statistics().session_lease is not None  # the handlers left it open


@one_loop
async def test_round_completes_although_the_leader_is_killed_while_forming(
    etcd_cluster: EtcdCluster,
) -> None:
    """8 handlers (own connections) form a round while etcd's leader dies midway."""
    endpoints = etcd_cluster.endpoints
    handlers = [get_rendezvous_handler(params(endpoints, "leader", 8)) for _ in range(8)]
    async with (
        EtcdStore(endpoints, prefix="/aioelastic/") as observer,
        handlers[0], handlers[1], handlers[2], handlers[3],
        handlers[4], handlers[5], handlers[6], handlers[7],
    ):  # fmt: skip
        results: list[tuple[int, int]] = []

        async def one(handler: RendezvousHandler) -> None:
            info = await handler.next_rendezvous()
            results.append((info.rank, info.world_size))

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for handler in handlers[:7]:
                    tg.start_soon(one, handler)
                # Once 7 have joined (they wait for the 8th), kill the leader, then add the 8th.
                joins = "rdzv/leader/round/1/join/"
                snapshot = await observer.get_prefix(joins)
                while len(snapshot.items) < 7:
                    await observer.wait_for_change(joins, after=snapshot.revision)
                    snapshot = await observer.get_prefix(joins)
                await anyio.to_thread.run_sync(etcd_cluster.leader().kill)
                tg.start_soon(one, handlers[7])
    assert sorted(results) == [(rank, 8) for rank in range(8)]


_VICTIM = """
import sys, anyio
from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

async def main():
    endpoints, run = sys.argv[1], sys.argv[2]
    params = RendezvousParameters("etcd", endpoints, run, 3, 3, local_addr="127.0.0.1",
                                  keep_alive_interval="1", heartbeat_timeout="3")
    async with get_rendezvous_handler(params) as handler:
        info = await handler.next_rendezvous()
        print("rank", info.rank, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


@one_loop
async def test_a_killed_nodes_lease_expiry_invalidates_the_survivors_round(
    etcd_server: EtcdCluster,
) -> None:
    """A participant process killed with SIGKILL stops renewing its lease; when etcd expires
    it, both survivors learn their round is invalid (participant lost)."""
    endpoints = etcd_server.endpoints
    run = "victim"
    survivors = [get_rendezvous_handler(params(endpoints, run, 3, **FAST_LIVENESS)) for _ in "ab"]
    command = [sys.executable, "-c", textwrap.dedent(_VICTIM), endpoints, run]
    async with await anyio.open_process(command, stderr=None) as victim:
        async with survivors[0], survivors[1]:
            with anyio.fail_after(60):
                ranks = await form(survivors)
                assert victim.stdout is not None
                line = b""
                while not line.endswith(b"\n"):
                    line += await victim.stdout.receive()
                assert line.startswith(b"rank ")
                assert sorted([r for r, _ in ranks] + [int(line.split()[1])]) == [0, 1, 2]
                victim.kill()
                verdicts = [await s.wait_round_invalidated() for s in survivors]
        assert {v.reason for v in verdicts} == {InvalidationReason.PARTICIPANT_LOST}


@one_loop
async def test_a_paused_member_does_not_make_its_nodes_look_dead(
    etcd_cluster: EtcdCluster,
) -> None:
    """A node whose etcd member is paused (SIGSTOP) keeps its liveness key fresh through the
    other members, so its round stays valid over more than a heartbeat timeout."""
    leader = await anyio.to_thread.run_sync(etcd_cluster.leader)
    paused = next(m for m in etcd_cluster.members if m is not leader)
    others = ",".join(m.endpoint for m in etcd_cluster.members if m is not paused)
    # One node starts on the member to be paused, the other (which watches it) elsewhere.
    handlers = [
        get_rendezvous_handler(params(endpoints, "paused", 2, **FAST_LIVENESS))
        for endpoints in (f"{paused.endpoint},{others}", f"{others},{paused.endpoint}")
    ]
    events: list[object] = []
    async with handlers[0], handlers[1], EtcdStore(others, prefix="/aioelastic/") as reader:
        for handler in handlers:
            handler.subscribe(events.append)
        with anyio.fail_after(60):
            await form(handlers)
            completed = len(events)
            revision = (await reader.get_prefix("rdzv/paused/node/")).revision
            paused.signal(signal.SIGSTOP)
            try:
                # 8 rewrites of the two liveness keys (keep-alive every 1 s) outlast the 3 s
                # heartbeat timeout; with 5 s attempts a key lapsed and the round was lost.
                for _ in range(8):
                    revision = await reader.wait_for_change("rdzv/paused/node/", after=revision)
            finally:
                paused.signal(signal.SIGCONT)
        during = events[completed:]
    assert during == []


@one_loop
async def test_an_unreachable_cluster_is_a_connection_error_naming_the_endpoints(
    etcd_cluster: EtcdCluster,
) -> None:
    """With every member down, next_rendezvous raises RendezvousConnectionError after
    read_timeout, and the message names the endpoints."""
    endpoints = etcd_cluster.endpoints
    handler = get_rendezvous_handler(params(endpoints, "down", 2, read_timeout="1"))
    async with handler:
        await anyio.to_thread.run_sync(lambda: etcd_cluster.stop(timeout=1))
        with anyio.fail_after(60):
            pattern = "etcd://" + endpoints.replace(".", r"\.")
            with pytest.raises(RendezvousConnectionError, match=pattern):
                await handler.next_rendezvous()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"protocol": "gopher"}, "protocol='gopher' must be http or https"),
        ({"store": object()}, "is not an EtcdStore"),
        ({"read_timeout": "0"}, "read_timeout=0 must be a positive number"),
        ({"cacert": "/nonexistent/ca.pem"}, "cannot read etcd TLS ca_cert file"),
        ({"etcd_prefx": "/x"}, "unknown rendezvous option"),
        ({"cert": "a.pem", "ssl_cert": "b.pem"}, "ssl_cert and cert are the same setting"),
    ],
)
def test_bad_configuration_is_a_parameter_error(config: dict[str, Any], message: str) -> None:
    """A bad etcd option raises RendezvousParameterError naming it."""
    with pytest.raises(RendezvousParameterError, match=message):
        get_rendezvous_handler(params("127.0.0.1:2379", "bad", 1, **config))


@pytest.mark.parametrize(
    ("interval", "heartbeat", "expected"), [(0.5, 3, 1.25), (5, 15, 5.0), (1, 30, 5.0)]
)
def test_store_attempts_give_up_before_a_keep_alive_would_lapse(
    interval: float, heartbeat: float, expected: float
) -> None:
    """One store attempt takes at most half the slack between keep-alives and expiry, <= 5 s."""
    settings = ElasticSettings(
        "job", 1, 1, keep_alive_interval=interval, heartbeat_timeout=heartbeat
    )
    assert settings.attempt_timeout == expected


_WORKER = "import os; print('worker', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"


def revoke_liveness_leases(endpoints: str, prefix: str) -> int:
    """Revoke the lease of every liveness key under ``prefix`` (as etcd does to an expired
    one); return how many there were."""
    with grpc.insecure_channel(endpoints.split(",")[0]) as channel:
        start = prefix.encode()
        kvs = rpc.KVStub(channel).Range(rpc.RangeRequest(key=start, range_end=start + b"\xff")).kvs
        leases = {kv.lease for kv in kvs if kv.key.endswith(b"/alive")}
        for lease in leases:
            rpc.LeaseStub(channel).LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=10)
    return len(leases)


@one_loop
async def test_a_node_whose_liveness_lease_is_gone_fences_its_round(
    etcd_server: EtcdCluster,
) -> None:
    """A lease the store finds gone at its next renewal (revoked here; expired while this
    node's clock still held it) fences the round at once, as a lapsed lease would."""
    prefix = "/aioelastic-test/lease-fence"
    config = {**FAST_LIVENESS, "etcd_prefix": prefix}
    handler = get_rendezvous_handler(params(etcd_server.endpoints, "fence", 1, **config))
    async with handler:
        with anyio.fail_after(60):
            assert await form([handler]) == [(0, 1)]
            assert (
                await anyio.to_thread.run_sync(
                    revoke_liveness_leases, etcd_server.endpoints, prefix
                )
                == 1
            )
            verdict = await handler.wait_round_invalidated()
    assert verdict.reason is InvalidationReason.FENCED
    assert "the store lost its liveness lease" in verdict.detail


_SLEEPER = (
    "import os, time; print('worker of round', os.environ['AIOELASTIC_ROUND'], flush=True); "
    "time.sleep(600)"
)


@one_loop
async def test_an_agent_whose_etcd_lease_is_gone_kills_its_workers_and_joins_again(
    etcd_server: EtcdCluster,
) -> None:
    """`aioelastic run` over etcd: once its liveness lease is gone, the agent says it is
    fenced, kills its worker and starts one in a new round."""
    prefix = "/aioelastic-test/agent-lease-fence"
    command = [
        sys.executable, "-m", "aioelastic", "run", "--nnodes", "1", "--nproc-per-node", "1",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_server.endpoints, "--rdzv-id", "fence",
        "--rdzv-conf", f"keep_alive_interval=1,heartbeat_timeout=3,etcd_prefix={prefix}",
        "--no-python", "--", sys.executable, "-c", _SLEEPER,
    ]  # fmt: skip
    lines: list[str] = []
    async with await anyio.open_process(command, stderr=subprocess.STDOUT) as agent:
        assert agent.stdout is not None
        output = BufferedByteReceiveStream(agent.stdout)

        async def line_with(text: str) -> str:
            while True:
                lines.append((await output.receive_until(b"\n", 1 << 16)).decode())
                if text in lines[-1]:
                    return lines[-1]

        try:
            with anyio.fail_after(60):  # generous: two rounds of a real agent and worker
                await line_with("worker of round 1")
                await anyio.to_thread.run_sync(
                    revoke_liveness_leases, etcd_server.endpoints, prefix
                )
                fenced = await line_with("killing the workers (SIGKILL) and joining again")
                await line_with("worker of round 2")
        finally:
            agent.terminate()
    assert "fenced: round 1 fenced: the store lost its liveness lease" in fenced, "\n".join(lines)


@one_loop
async def test_two_agents_form_a_job_through_etcd(etcd_server: EtcdCluster) -> None:
    """Two `aioelastic run` agents with --rdzv-backend etcd start one 2-worker job."""
    command = [
        sys.executable, "-m", "aioelastic", "run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_server.endpoints,
        "--rdzv-id", "cli-job", "--no-python", "--", sys.executable, "-c", _WORKER,
    ]  # fmt: skip
    outputs: list[str] = []

    async def agent() -> None:
        result = await anyio.run_process(command, check=False)
        assert result.returncode == 0, result.stderr.decode()
        outputs.append(result.stdout.decode())

    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent)
            tg.start_soon(agent)
    printed = sorted(line.split("]: ", 1)[-1] for out in outputs for line in out.splitlines())
    assert printed == ["worker 0 of 2", "worker 1 of 2"]


def test_etcd_v2_says_once_that_it_is_served_by_v3(caplog: pytest.LogCaptureFixture) -> None:
    """torch's etcd-v2 name is accepted; the first handler says the v3 API serves it."""
    from aioelastic.rendezvous import _etcd

    _etcd._say_v2_is_v3.cache_clear()
    for _ in range(2):
        handler = get_rendezvous_handler(
            RendezvousParameters("etcd-v2", "127.0.0.1:2379", "v2-job", 1, 1)
        )
        assert handler.get_backend() == "etcd-v2"
    said = [r.getMessage() for r in caplog.records if "etcd-v2" in r.getMessage()]
    assert len(said) == 1
    assert "served through etcd's v3 API" in said[0]
