"""Without an etcd binary, etcd tests skip saying how to get one, except under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/etcd/test_etcd_store.py::test_keys_live_under_the_job_prefix"


def run_without_etcd(ci: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIOELASTIC_ETCD_BINARY": "/nonexistent/etcd", "CI": ci}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("ci", "returncode", "says"),
    [
        ("", 0, "SKIPPED"),
        ("true", 1, "CI=true but no etcd binary found"),
    ],
)
def test_a_missing_binary_skips_or_fails_under_ci(ci: str, returncode: int, says: str) -> None:
    """The reason names apt-get and AIOELASTIC_ETCD_BINARY; under CI=true it is a failure."""
    result = run_without_etcd(ci)
    assert result.returncode == returncode, result.stdout
    assert says in result.stdout
    assert "apt-get install etcd-server" in result.stdout
    assert "AIOELASTIC_ETCD_BINARY" in result.stdout
