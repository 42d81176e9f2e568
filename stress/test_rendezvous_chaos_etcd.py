"""Stress: real `aioelastic run` agents over the etcd backend and a 3-member etcd cluster
under kills, SIGSTOP/SIGCONT and restarts of agents (4 to 16 live) and of etcd members (one
at a time); every completed round is checked.

The harness, its checks and its figures are in :mod:`stress._chaos`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aioelastic.testing import EtcdCluster
from stress._chaos import Chaos, ChaosPlan, MemberFaults, Store, faults, report, seed
from stress.conftest import Figures
from tests.etcd_fixtures import etcd_binary, etcd_cluster

__all__ = ["etcd_binary", "etcd_cluster"]  # the fixtures, imported for pytest

PLAN = ChaosPlan(faults=faults(200), min_live=4, max_live=16, seed=seed(13))


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


@pytest.mark.anyio
@pytest.mark.timeout(900)
async def test_etcd_rendezvous_survives_agent_and_member_faults(
    etcd_cluster: EtcdCluster, tmp_path: Path, figures: Figures
) -> None:
    """Every completed round has unique contiguous ranks; no round after a fault hangs."""
    store = Store("etcd", etcd_cluster.endpoints)
    chaos = Chaos(store, PLAN, tmp_path, MemberFaults(etcd_cluster))
    report(await chaos.run(), PLAN, figures)
