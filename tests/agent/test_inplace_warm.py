"""Warm spares under ``--recovery in-place``: a spare holds what the workers loaded."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.conftest import BOUND, launched

pytestmark = pytest.mark.anyio

WORKER = str(Path(__file__).parent / "workers" / "warm_plain.py")


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


async def test_a_spare_imports_what_the_workers_loaded_in_their_first_step(
    tmp_path: Path,
) -> None:
    """The workers import colorsys in their first step; the spare imports it while idle, so
    when it takes the place of a killed worker it holds colorsys before its first step."""
    finish = tmp_path / "finish"
    argv = ["--standalone", "--nproc-per-node", "2", "--recovery", "in-place", "--spares", "1"]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv, WORKER, str(finish)) as run:
            await run.err.wait_for("warming: imported")
            victim = int(re.findall(r"gen 1 rank 1 pid (\d+)", run.out.text)[0])
            os.kill(victim, signal.SIGKILL)
            await run.out.wait_for("gen 2 rank 1 pid")
            finish.touch()
            status = await run.wait()
    assert status == 0, run
    assert re.search(r"gen 1 rank 1 pid \d+ holds colorsys False", run.out.text)
    assert re.search(r"gen 2 rank 1 pid \d+ holds colorsys True", run.out.text)
    assert re.search(r"gen 2 rank 0 pid \d+ holds colorsys True", run.out.text)
