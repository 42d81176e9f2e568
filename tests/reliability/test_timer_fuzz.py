"""A short FIFO fuzz of a live timer server (the long one is ``stress/test_timer_fuzz.py``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.reliability.fifo_fuzz import Targets, fuzz_codec, fuzz_fifo

pytestmark = pytest.mark.anyio

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as user nobody")


def test_codec_verdicts_match_the_generators() -> None:
    """20,000 hostile lines in random chunks: the codec reaches the expected verdict on each."""
    targets = Targets([0, -1, 1], stranger=2, decoys=[3], missing=[40000])
    disagreements, kinds = fuzz_codec(20_000, seed=7, targets=targets)
    assert disagreements == {}
    assert kinds["oversized"] > 0


@needs_root
async def test_fifo_fuzz_loses_nothing_and_signals_nobody_wrongly(tmp_path: Path) -> None:
    """3,000 hostile lines beside a live worker: exact rejections, no wrong signal, worker reaped"""
    result = await fuzz_fifo(str(tmp_path), lines=3000, seed=1, timeout=60)
    assert result.wrong_signals == []
    assert result.survivors == {"stranger (nobody)": True, "sentinel": True, "decoys": True}
    assert (result.worker_reaped_by, result.worker_returncode) == (signal.SIGKILL, -signal.SIGKILL)
    assert result.fuzz_rejected() == result.report["rejected"]
    assert result.statistics.requests == result.report["lines"] + result.worker_lines + 1
