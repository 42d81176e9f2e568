"""Stress: a million hostile lines through a live timer server's FIFO, next to a real worker.

Also 200,000 lines (oversized ones included) fed to the line decoder in random chunks. Every
line's expected verdict is known, so the server's rejection counts must match exactly.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from stress.conftest import Figures
from tests.reliability.fifo_fuzz import Targets, fuzz_codec, fuzz_fifo

FIFO_LINES = 1_000_000
CODEC_LINES = 200_000


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


def test_codec_fuzz(figures: Figures) -> None:
    """The decoder reaches the expected verdict on 200,000 hostile lines cut at random."""
    targets = Targets([0, -1, 1], stranger=2, decoys=[3], missing=[40000])
    disagreements, kinds = fuzz_codec(CODEC_LINES, seed=11, targets=targets)
    figures["lines"] = CODEC_LINES
    figures["disagreements"] = dict(disagreements)
    figures["kinds"] = dict(kinds)
    assert disagreements == {}


@pytest.mark.anyio
@pytest.mark.timeout(900)
@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as user nobody")
async def test_fifo_fuzz_a_million_lines(tmp_path: Path, figures: Figures) -> None:
    """1,000,000 lines: exact rejections, 0 wrong signals, server serving, worker reaped."""
    result = await fuzz_fifo(str(tmp_path), lines=FIFO_LINES, seed=2026, timeout=600)
    stats = result.statistics
    figures["lines tried (fifo)"] = result.report["lines"]
    figures["worker lines"] = result.worker_lines
    figures["server requests"] = stats.requests
    figures["rejected by reason (server)"] = {str(k): v for k, v in stats.rejected.items()}
    figures["rejected of the worker's late lines"] = dict(result.worker_rejected)
    figures["accepted fuzz lines"] = result.report["accepted"]
    figures["wrong signals"] = len(result.wrong_signals)
    figures["reaps"] = stats.reaped
    figures["worker reaped by"] = result.worker_reaped_by
    figures["survivors"] = result.survivors
    figures["seconds"] = round(result.seconds, 1)
    figures["kinds"] = result.report["kinds"]
    assert result.wrong_signals == []
    assert all(result.survivors.values())
    assert (result.worker_reaped_by, result.worker_returncode) == (signal.SIGKILL, -signal.SIGKILL)
    assert result.fuzz_rejected() == result.report["rejected"]
    assert stats.requests == result.report["lines"] + result.worker_lines + 1
