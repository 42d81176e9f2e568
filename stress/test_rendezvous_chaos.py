"""Stress: real `aioelastic run` agents over c10d (a separate store server) under kills,
SIGSTOP/SIGCONT and restarts, 4 to 16 agents live; every completed round is checked.

The harness, its checks and its figures are in :mod:`stress._chaos`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stress._chaos import Chaos, ChaosPlan, Store, faults, report, seed
from stress.conftest import Figures
from stress.test_store_restart import free_port, kill_server, start_server

PLAN = ChaosPlan(faults=faults(200), min_live=4, max_live=16, seed=seed(11))


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


@pytest.mark.anyio
@pytest.mark.timeout(900)
async def test_rendezvous_survives_kills_pauses_and_restarts(
    tmp_path: Path, figures: Figures
) -> None:
    """Every completed round has unique contiguous ranks; no round after a fault hangs."""
    port = free_port()
    server = await start_server(port)
    try:
        outcome = await Chaos(Store("c10d", f"127.0.0.1:{port}"), PLAN, tmp_path).run()
    finally:
        kill_server(server)
    report(outcome, PLAN, figures)
