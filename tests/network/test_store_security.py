"""Intruders on another host cannot join, close or read a secured job; its round goes on.

Three hosts: ``a`` hosts the c10d store of a two-node job, ``b`` is its second node, ``c``
is the intruder. Every intrusion comes from ``c`` over the network: against a token, while
``a`` waits for the round, then ``b`` joins and the round completes with exactly the two of
them, not closed; against token and TLS, under two real ``aioelastic run`` agents.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from aioelastic.testing import Host, Network
from tests.network._job import Collector, Job
from tests.reliability.test_store_tls import Pki

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

NODE = str(Path(__file__).with_name("secure_node.py"))
PORT = 29400
BOUND = 60  # generous: a cold interpreter start on a loaded machine, then one short round


async def line(output: BufferedByteReceiveStream) -> str:
    with anyio.fail_after(BOUND):
        return (await output.receive_until(b"\n", 10_000)).decode()


async def run(host: Host, *args: str) -> str:
    """Run one secure_node.py mode on ``host`` to its end; return its output."""
    with anyio.fail_after(BOUND):
        done = await host.run([sys.executable, NODE, *args])
    return done.stdout.decode().strip()


@asynccontextmanager
async def job_node(host: Host, *args: str) -> AsyncIterator[BufferedByteReceiveStream]:
    """A c10d node on ``host``, its output as lines; told to leave when the block ends."""
    process = await host.start([sys.executable, NODE, "node", *args])
    assert process.stdout is not None
    assert process.stdin is not None
    try:
        yield BufferedByteReceiveStream(process.stdout)
        await process.stdin.send(b"leave\n")
        with anyio.fail_after(BOUND):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()


async def test_token_job_refuses_intruders_from_another_host_and_forms_its_world(
    tmp_path: Path,
) -> None:
    """No token, a wrong token, a replayed handshake, garbage, a tokenless node: all refused."""
    token, wrong, recorded = tmp_path / "token", tmp_path / "wrong", tmp_path / "recorded"
    token.write_text("the-job-token-" + "7" * 40)
    wrong.write_text("a-guess-" + "1" * 40)
    async with Network(3) as net:
        a, b, c = net.hosts
        endpoint, conf = f"{a.addr}:{PORT}", f"token_file={token}"
        async with job_node(a, endpoint, "true", conf) as first:
            assert await line(first) == "listening"
            assert (await run(b, "record", endpoint, str(token), str(recorded))).startswith(
                "recorded"
            )
            outcomes = {
                kind: await run(c, "attack", endpoint, *args)
                for kind, args in {
                    "no-token": ["no-token"],
                    "wrong-token": ["wrong-token", str(wrong)],
                    "replay": ["replay", str(recorded)],
                    "garbage": ["garbage"],
                    "join-no-token": ["join-no-token"],
                }.items()
            }
            assert outcomes["no-token"].startswith("refused")
            assert "requires a token" in outcomes["no-token"]
            assert "the token does not match" in outcomes["wrong-token"]
            assert outcomes["replay"] == "refused ['CHALLENGE', 'REFUSED']"
            assert outcomes["garbage"].startswith("closed")
            assert "requires a token" in outcomes["join-no-token"]
            assert await run(b, "check", endpoint, str(token), "planted") == "absent"
            async with job_node(b, endpoint, "false", conf) as second:
                assert await line(second) == "listening"
                joined = sorted([await line(first), await line(second)])
    assert joined == ["joined rank 0 of 2 closed False", "joined rank 1 of 2 closed False"]


async def test_aioelastic_run_on_two_hosts_with_token_and_tls_keeps_a_third_out(
    tmp_path: Path,
) -> None:
    """Two `aioelastic run` agents with the token and certificates form a world. From a third
    host, a client without a certificate, one in clear, garbage and an agent with neither
    token nor certificate are all refused, and the world stays the same two, same round."""
    workdir = Path(tempfile.mkdtemp(prefix="aioe-"))  # a UNIX socket path must be short
    pki, token = Pki(tmp_path), tmp_path / "token"
    token.write_text("the-job-token-" + "9" * 40)
    token.chmod(0o600)
    collector = Collector(workdir / "records.sock")
    try:
        async with Network(3) as net, anyio.create_task_group() as tg:
            a, b, c = net.hosts
            await tg.start(collector.serve)
            job = Job(net, workdir, collector)
            endpoint = f"{a.addr}:{PORT}"
            for host in (a, b):
                cert, key = pki.node(f"node{host.index}", host.addr)
                conf = f"token_file={token},cacert={pki.cacert},cert={cert},key={key}"
                await job.start(tg, [host], backend="c10d", endpoint=endpoint, conf=conf,
                                nnodes="2:3")  # fmt: skip
            world = await collector.wait_for(lambda: collector.world([a, b]))
            no_cert = await run(c, "attack", endpoint, "no-cert", str(pki.cacert))
            assert no_cert.startswith("refused")
            assert "alert certificate required" in no_cert
            plain = await run(c, "attack", endpoint, "no-token")
            assert plain.startswith("refused")
            assert "speaks in clear" in plain
            assert (await run(c, "attack", endpoint, "garbage")).startswith("closed")
            await job.start(tg, [c], backend="c10d", endpoint=endpoint, conf="read_timeout=5",
                            nnodes="2:3")  # fmt: skip
            intruder = job.agent(c)
            with anyio.fail_after(BOUND):
                assert await intruder.process.wait() != 0
            assert "refused this node" in intruder.console
            assert collector.world([a, b]) == world
            assert len(collector.workers) == 2  # nobody restarted, nobody joined
            await job.stop()
            tg.cancel_scope.cancel()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
