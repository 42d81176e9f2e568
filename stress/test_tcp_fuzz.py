"""Stress: the TCP store's codec and a live server under hostile traffic, good clients checked."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from stress.conftest import Figures
from tests.reliability.tcp_fuzz import abuse_server, fuzz_codec

CODEC_BODIES = 500_000


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


def test_codec_fuzz(figures: Figures) -> None:
    """500,000 mutated bodies through both decoders and the frame reader: no stray exception."""
    outcomes, failures = fuzz_codec(CODEC_BODIES, seed=17)
    figures["bodies"] = CODEC_BODIES
    figures["decode calls by outcome"] = dict(outcomes)
    figures["other exceptions"] = dict(failures)
    assert failures == {}


@pytest.mark.anyio
@pytest.mark.timeout(900)
async def test_live_server_abuse(figures: Figures) -> None:
    """100,000 fuzz frames, 1,000 simultaneous connections, slow-loris, half-open, stalled
    readers and garbage, all at once; every well-formed client's operation is right."""
    report = await abuse_server(
        seed=2026,
        fuzzers=20,
        frames_per_fuzzer=5000,
        garbage=200,
        silent=200,
        stalled=20,
        simultaneous=1000,
        good_clients=8,
        good_rounds=200,
    )
    figures["fuzz frames sent"] = report.frames_sent
    figures["frame kinds"] = dict(report.frame_kinds)
    figures["replies by status"] = dict(report.replies)
    figures["connections by kind"] = dict(report.connections)
    figures["dropped as expected"] = dict(report.dropped_as_expected)
    figures["simultaneous connections correct"] = report.simultaneous_ok
    figures["simultaneous connections failed"] = dict(report.simultaneous_failed)
    figures["good operations checked"] = report.good_operations
    figures["good operations wrong"] = len(report.good_mismatches)
    figures["server statistics"] = asdict(report.server_statistics)
    figures["served after"] = report.served_after
    assert report.good_mismatches == []
    assert report.simultaneous_ok == 1000
    assert report.dropped_as_expected == {"garbage": 200, "slow-loris": 100, "half-open": 100}
    assert report.served_after
