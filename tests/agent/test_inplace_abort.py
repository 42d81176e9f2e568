"""Leaving a collective whose peer never answers: the worker's abort, its wire, its /proc reading.

The real-process tests run two gloo ranks without an agent (``workers/abort_probe.py``): rank 1
stops itself (SIGSTOP: no reset is ever sent, as from a partitioned host), rank 0 blocks in an
``all_reduce`` with it, and the test, standing in for the agent, asks rank 0 to abort.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.worker._abort import (
    ABORT_FD_ENV,
    ABORT_SWITCH_ENV,
    AbortLines,
    AbortOutcome,
    AbortProtocolError,
    AbortReply,
    AbortRequest,
    TcpSocket,
    encode_abort,
    parse_proc_net_tcp,
)
from tests.agent.conftest import BOUND, free_port, launched

PROBE = str(Path(__file__).parent / "workers" / "abort_probe.py")

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


@pytest.mark.parametrize(
    "message",
    [
        AbortRequest(3),
        AbortReply(3, AbortOutcome.ABORTED, "gloo: shut down 2 connection(s)"),
        AbortReply(4, AbortOutcome.UNAVAILABLE, "backend 'mpi' has no abort here"),
    ],
)
def test_abort_messages_round_trip(message: AbortRequest | AbortReply) -> None:
    """Each message decodes to itself, also when its line arrives in pieces."""
    data = encode_abort(message)
    lines = AbortLines()
    assert lines.feed(data[:5]) == []
    assert lines.feed(data[5:]) == [message]


def test_a_bad_abort_line_is_an_error_that_shows_it() -> None:
    """A line that is no abort message names its bytes."""
    with pytest.raises(AbortProtocolError, match=r"not an abort message: b'\{\"done\": 1\}'"):
        AbortLines().feed(b'{"done": 1}\n')


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4101 1
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4102 1
   2: 020012C6:8CA1 030012C6:B2F1 01 00000000:00000000 00:00000000 00000000     0        0 4103 1
"""

PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue
   0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000200007F:C350 01 0:0 0:0 0 0 0 4104 1
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 4105 1
"""  # noqa: E501


def test_proc_net_tcp_rows_give_each_sockets_ends_and_state() -> None:
    """Addresses are read as little-endian 32-bit words; v4-mapped v6 addresses as v4."""
    assert parse_proc_net_tcp(PROC_NET_TCP, v6=False) == [
        TcpSocket(4101, False, ("127.0.0.1", 8080), ("0.0.0.0", 0)),
        TcpSocket(4102, True, ("127.0.0.1", 54321), ("127.0.0.1", 8080)),
        TcpSocket(4103, True, ("198.18.0.2", 36001), ("198.18.0.3", 45809)),
    ]
    assert parse_proc_net_tcp(PROC_NET_TCP6, v6=True) == [
        TcpSocket(4104, True, ("127.0.0.1", 8080), ("127.0.0.2", 50000)),
        TcpSocket(4105, False, ("::1", 22), ("::", 0)),
    ]


def test_only_the_rows_of_the_given_sockets_are_read() -> None:
    """With inodes, the other sockets of the namespace (any number) are skipped unread."""
    noise = "".join(f"   {n}: garbled row of another process 6 7 8 {9000 + n}\n" for n in range(50))
    assert parse_proc_net_tcp(PROC_NET_TCP + noise, v6=False, inodes={4102}) == [
        TcpSocket(4102, True, ("127.0.0.1", 54321), ("127.0.0.1", 8080)),
    ]


@asynccontextmanager
async def two_ranks(
    env: dict[str, str], where: str = "collective"
) -> AsyncIterator[tuple[anyio.abc.Process, socket.socket]]:
    """The probe's two ranks; yields rank 0 (its stdout a pipe) and the agent's end of its
    abort socket. Rank 1 (stopped) and rank 0 are killed on the way out."""
    port = free_port()
    async with launched("--port", str(port), command="store-server") as store:
        await store.out.wait_for("listening")
        async with _ranks(port, env, where) as ranks:
            yield ranks


@asynccontextmanager
async def _ranks(
    port: int, env: dict[str, str], where: str
) -> AsyncIterator[tuple[anyio.abc.Process, socket.socket]]:
    ours, theirs = socket.socketpair()
    env = {**os.environ, **env, ABORT_FD_ENV: str(theirs.fileno())}
    rank0 = await anyio.open_process(
        [sys.executable, PROBE, "0", str(port), where],
        env=env,
        pass_fds=(theirs.fileno(),),
        stderr=subprocess.STDOUT,
    )
    theirs.close()
    rank1 = await anyio.open_process(
        [sys.executable, PROBE, "1", str(port), where], stdout=None, stderr=None
    )
    try:
        async with rank0, rank1:
            yield rank0, ours
            for process in (rank1, rank0):
                if process.returncode is None:
                    process.kill()
    finally:
        ours.close()


async def read_until(process: anyio.abc.Process, text: str, seen: bytearray) -> str:
    """Read ``process``'s output until ``text`` appeared; return all of it so far."""
    assert process.stdout is not None
    while text.encode() not in seen:
        seen += await process.stdout.receive()
    return seen.decode()


async def ask_abort(sock: socket.socket, generation: int) -> AbortReply | AbortRequest:
    sock.setblocking(False)
    sock.send(encode_abort(AbortRequest(generation)))
    lines = AbortLines()
    while True:
        await anyio.wait_readable(sock)
        for message in lines.feed(sock.recv(4096)):
            return message


@pytest.mark.torch
@needs_torch
@pytest.mark.anyio
async def test_an_abort_gets_gloo_out_of_a_collective_whose_peer_never_answers() -> None:
    """Asked to abort, rank 0's watch shuts down its process group's connections: the blocked
    all_reduce raises (gloo's own timeout is 600 s, far beyond the bound), the reply says so,
    and the same process makes a new process group at once."""
    seen = bytearray()
    with anyio.fail_after(BOUND):
        async with two_ranks({}) as (rank0, sock):
            await read_until(rank0, "blocking pid", seen)
            reply = await ask_abort(sock, 1)
            text = await read_until(rank0, "world of one", seen)
    assert isinstance(reply, AbortReply)
    assert (reply.generation, reply.outcome) == (1, AbortOutcome.ABORTED)
    assert reply.detail.startswith("gloo: shut down ")
    assert "left on RuntimeError" in text
    assert "Connection closed by peer" in text
    assert "all_reduce returned" not in text
    assert "store forgotten: False" in text
    assert "world of one: sum 1" in text


@pytest.mark.torch
@needs_torch
@pytest.mark.anyio
async def test_an_abort_gets_a_worker_out_of_init_waiting_for_a_peer_that_never_comes() -> None:
    """Rank 1 never makes its process group: rank 0 waits in init_process_group (in the store,
    for rank 1's address). Without a process group yet, the abort shuts down the world's store
    connection: the wait raises, the world is told to forget that connection, and the process
    makes a world of one over another connection."""
    seen = bytearray()
    with anyio.fail_after(BOUND):
        async with two_ranks({}, "init") as (rank0, sock):
            await read_until(rank0, "blocking pid", seen)
            reply = await ask_abort(sock, 1)
            text = await read_until(rank0, "world of one", seen)
    assert reply == AbortReply(
        1, AbortOutcome.ABORTED, "no process group yet: shut down 1 store connection(s)"
    )
    assert "left on" in text
    assert "store forgotten: True" in text
    assert "world of one: sum 1" in text


@pytest.mark.torch
@needs_torch
@pytest.mark.anyio
async def test_an_abort_turned_off_says_unavailable_and_leaves_the_collective_alone() -> None:
    """With AIOELASTIC_WORKER_ABORT=0 the reply is "unavailable" (the agent's cue to restart
    the worker if it does not leave) and nothing is shut down."""
    seen = bytearray()
    with anyio.fail_after(BOUND):
        async with two_ranks({ABORT_SWITCH_ENV: "0"}) as (rank0, sock):
            await read_until(rank0, "blocking pid", seen)
            reply = await ask_abort(sock, 1)
            assert rank0.returncode is None
            rank0.send_signal(signal.SIGKILL)
    assert reply == AbortReply(1, AbortOutcome.UNAVAILABLE, f"turned off ({ABORT_SWITCH_ENV}=0)")
    assert "left on" not in seen.decode()


@pytest.mark.torch
@needs_torch
@pytest.mark.anyio
async def test_an_abort_for_another_generation_does_nothing() -> None:
    """A request for a world the worker is not in is answered "nothing"; it stays in its own."""
    seen = bytearray()
    with anyio.fail_after(BOUND):
        async with two_ranks({}) as (rank0, sock):
            await read_until(rank0, "blocking pid", seen)
            reply = await ask_abort(sock, 7)
            rank0.send_signal(signal.SIGKILL)
    assert reply == AbortReply(7, AbortOutcome.NOTHING, "in generation 1")
