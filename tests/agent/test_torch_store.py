"""Workers use the agent's torch store (``TORCHELASTIC_USE_AGENT_STORE=True``), as torchrun's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.agent import WorkerSpecError
from aioelastic.agent._worker_store import WorkerStore
from aioelastic.rendezvous import RendezvousParameters
from aioelastic.rendezvous._static import StaticRendezvousHandler
from tests.agent.conftest import BOUND, free_port, launched, static_argv

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "agent_torch_store.py")
STORE_LINE = re.compile(r"rank (\d) attempt (\d) agent store (\w+) at ([\d.]+):(\d+)")


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


def elastic_argv(backend: str, endpoint: str, *extra: str) -> list[str]:
    return [
        "--nnodes=2",
        "--nproc-per-node=1",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id=torch-store-{backend}",
        "--rdzv-conf=last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5",
        "--max-restarts=2",
        *extra,
    ]


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
async def test_two_agents_serve_their_workers_on_loopback_for_every_attempt(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """--loopback-torch-store: gloo over env:// with each agent's loopback store, relayed to the
    job's; a restart too."""
    if backend == "etcd":
        endpoint = request.getfixturevalue("etcd_server").endpoints
    else:
        endpoint = f"127.0.0.1:{free_port()}"
    marker = tmp_path / "failed-once"
    argv = [
        *elastic_argv(backend, endpoint, "--loopback-torch-store"),
        EXAMPLE,
        "--fail-once",
        str(marker),
    ]
    with anyio.fail_after(BOUND * 4):
        async with launched(*argv) as first, launched(*argv) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    assert marker.exists()  # rank 1 failed in the first attempt
    ports = []
    for agent in (first, second):
        lines = STORE_LINE.findall(agent.out.text)
        assert len(lines) >= 2, agent  # the failed attempt and the one after it
        assert {(use, addr) for _, _, use, addr, _ in lines} == {("True", "127.0.0.1")}
        agent_ports = {port for *_, port in lines}
        assert len(agent_ports) == 1, agent  # one listener serves every attempt
        ports.append(agent_ports.pop())
        assert re.search(r"rank \d/2 attempt \d: sum 3", agent.out.text), agent
    assert ports[0] != ports[1]  # each agent serves its own workers


async def test_exposed_static_store_is_exactly_the_master_address_and_port() -> None:
    """--expose-torch-store: static workers get --master-addr/--master-port, torchrun's way."""
    port = free_port()

    def argv(node_rank: int) -> list[str]:
        return static_argv(port, node_rank, "--expose-torch-store", EXAMPLE)

    with anyio.fail_after(BOUND * 2):
        async with launched(*argv(0)) as first, launched(*argv(1)) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    for agent in (first, second):
        [(_, _, use, addr, master_port)] = STORE_LINE.findall(agent.out.text)
        assert (use, addr, int(master_port)) == ("True", "127.0.0.1", port)
        assert re.search(r"rank \d/2 attempt 0: sum 3", agent.out.text), agent


async def test_a_static_restart_is_job_wide_and_reads_no_stale_address() -> None:
    """Default flags, static 2 nodes: rank 1 dies while rank 0's worker is outside any
    collective; rank 0's node restarts too, and the next attempt's workers meet in a clean
    store (exactly --master-addr/--master-port), not at the old worker's address."""
    port = free_port()

    def argv(node_rank: int) -> list[str]:
        return static_argv(
            port,
            node_rank,
            "--max-restarts=1",
            str(Path(__file__).parent / "workers" / "static_restart.py"),
        )

    with anyio.fail_after(BOUND * 2):
        async with launched(*argv(0)) as first, launched(*argv(1)) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    assert "rank 1 failed: killed by SIGKILL" in second.err.text
    assert "membership changed (restarting)" in first.err.text, first
    for rank, agent in enumerate((first, second)):
        assert f"rank {rank} sum 2" in agent.out.text, agent


def test_exposing_a_secured_static_store_is_refused(tmp_path: Path) -> None:
    """Torch clients send no token: sharing a token-protected static store is refused at start."""
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-enough-length")
    token.chmod(0o600)
    params = RendezvousParameters(
        backend="static",
        endpoint="127.0.0.1:1",
        run_id="job",
        min_nodes=1,
        max_nodes=1,
        rank="0",
        token_file=str(token),
    )
    handler = StaticRendezvousHandler(params)
    with pytest.raises(WorkerSpecError, match="cannot share a static job's store secured"):
        WorkerStore(handler, expose=True)
    assert WorkerStore(handler).listener.host == "127.0.0.1"


async def test_exposed_elastic_store_is_served_by_group_rank_0() -> None:
    """--expose-torch-store over c10d: every worker gets the round's bootstrap address and
    port, where group rank 0's agent serves torch's protocol (torchrun's arrangement)."""
    argv = [
        *elastic_argv("c10d", f"127.0.0.1:{free_port()}", "--expose-torch-store"),
        "--local-addr=127.0.0.1",
        EXAMPLE,
    ]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv) as first, launched(*argv) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    [(_, _, use0, addr0, port0)] = STORE_LINE.findall(first.out.text)
    [(_, _, use1, addr1, port1)] = STORE_LINE.findall(second.out.text)
    assert (use0, addr0, port0) == (use1, addr1, port1) == ("True", "127.0.0.1", port0)
    for agent in (first, second):
        assert re.search(r"rank \d/2 attempt 0: sum 3", agent.out.text), agent
