"""The etcd example and the README's etcd snippet run against the session's etcd."""

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
def test_readme_etcd_snippet_runs(
    etcd_server: EtcdCluster, etcd_prefix: str, tmp_path: Path
) -> None:
    """The README's etcd snippet runs (on the session's etcd) and prints what it promises."""
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    section = readme.split("\n### etcd\n", 1)[1]
    snippet = section.split("```python", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("127.0.0.1:2379", etcd_server.endpoints)
    script = tmp_path / "snippet.py"
    script.write_text(snippet.replace("/jobs/train-42/", etcd_prefix))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, "1\n1\n"), result.stderr


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
