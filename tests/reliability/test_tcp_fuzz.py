"""A short abuse run against a live TCP store server (the long one is in ``stress/``)."""

from __future__ import annotations

import anyio
import pytest

from aioelastic.store import TCPStoreServer
from tests.reliability.tcp_fuzz import abuse_server, fuzz_codec

pytestmark = pytest.mark.anyio


def test_codec_refuses_mutated_frames_cleanly() -> None:
    """5,000 mutated bodies: each decodes or raises StoreProtocolError, nothing else."""
    outcomes, failures = fuzz_codec(5000, seed=3)
    assert failures == {}
    assert outcomes["refused"] > 0
    assert outcomes["decoded"] > 0


async def test_hostile_connections_leave_good_clients_correct() -> None:
    """Fuzzers, garbage, slow-loris, half-open, stalled and 100 simultaneous connections at once:
    every well-formed client's result is right and the server still serves."""
    report = await abuse_server(
        seed=5,
        fuzzers=4,
        frames_per_fuzzer=200,
        garbage=4,
        silent=4,
        stalled=2,
        simultaneous=100,
        good_clients=3,
        good_rounds=10,
        handshake_timeout=2.0,
    )
    assert report.good_mismatches == []
    assert report.simultaneous_ok == 100
    assert report.dropped_as_expected == {"garbage": 4, "slow-loris": 2, "half-open": 2}
    assert report.served_after
    assert report.server_statistics.bad_requests > 0


async def test_a_burst_of_silent_connections_is_dropped_in_full() -> None:
    """600 connections opened at once that never speak are all closed by the handshake timeout
    (none is left in a full accept queue, connected on the client side but never accepted)."""
    closed = 0
    async with TCPStoreServer(handshake_timeout=0.5) as server:

        async def silent() -> None:
            nonlocal closed
            async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await stream.receive()
                closed += 1

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for _ in range(600):
                    group.start_soon(silent)
    assert closed == 600
