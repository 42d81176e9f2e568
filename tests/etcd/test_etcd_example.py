"""The etcd examples run against a real etcd (the docs' etcd snippet: tests/docs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aioelastic.testing import EtcdCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "etcd_store.py"
CLUSTER_EXAMPLE = EXAMPLE.with_name("etcd_test_cluster.py")


@pytest.mark.etcd
def test_etcd_example_stores_and_forms_a_round(etcd_server: EtcdCluster) -> None:
    """etcd_store.py: a TTL key, an add, counted writes, and two nodes ranked 0 and 1 of 2."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), etcd_server.endpoints],
        capture_output=True,
        text=True,
        timeout=60,  # generous: the example needs about a second
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[:3] == ["arrival: 1", "alive: ['alive/node-0']", "joined: 1 then 2"]
    assert sorted(line.split(": ", 1)[1] for line in lines[3:]) == ["rank 0 of 2", "rank 1 of 2"]


@pytest.mark.etcd
def test_etcd_test_cluster_example_outlives_its_leader(etcd_binary: str) -> None:
    """etcd_test_cluster.py: the test kit's 3-member cluster; an add after the leader's loss."""
    done = subprocess.run(
        [sys.executable, str(CLUSTER_EXAMPLE)],
        env={**os.environ, "AIOELASTIC_ETCD_BINARY": etcd_binary},
        capture_output=True,
        text=True,
        timeout=120,  # generous: three etcd processes, an election and a failover
        check=True,
    )
    assert done.stdout.splitlines() == ["before: 1", "after the leader's loss: 2"]
