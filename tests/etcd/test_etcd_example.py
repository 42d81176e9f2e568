"""The etcd example runs against the session's etcd and prints what its docstring promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aioelastic.store._etcd_process import EtcdCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "etcd_store.py"


@pytest.mark.etcd
def test_etcd_example_stores_and_forms_a_round(etcd_server: EtcdCluster) -> None:
    """etcd_store.py: a TTL key, an add, and two nodes ranked 0 and 1 of 2."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), etcd_server.endpoints],
        capture_output=True,
        text=True,
        timeout=60,  # generous: the example needs about a second
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[:2] == ["arrival: 1", "alive: ['alive/node-0']"]
    assert sorted(line.split(": ", 1)[1] for line in lines[2:]) == ["rank 0 of 2", "rank 1 of 2"]
