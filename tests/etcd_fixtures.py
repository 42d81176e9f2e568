"""etcd for tests: a session-wide single member, 3-member clusters, and an open EtcdStore.

Registered as a pytest plugin by ``tests/conftest.py``. The binary comes from
``$AIOELASTIC_ETCD_BINARY``, then ``PATH``. Without one, tests that need etcd skip with a
reason saying how to get it, except under CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aioelastic.testing import HOW_TO_GET_ETCD, EtcdCluster, find_etcd_binary


def _backend_name(anyio_backend: Any) -> str:
    return anyio_backend[0] if isinstance(anyio_backend, tuple) else str(anyio_backend)


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    """The etcd binary; skips (fails under CI) when there is none."""
    binary = find_etcd_binary()
    if binary is None:
        message = f"no etcd binary found: {HOW_TO_GET_ETCD}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
    return binary


def start_cluster(binary: str, base_dir: Path, size: int, **options: Any) -> EtcdCluster:
    """Start a cluster on free ports, retrying once if another process took a port."""
    for attempt in range(3):
        cluster = EtcdCluster(binary, base_dir / f"try{attempt}", size, **options)
        try:
            cluster.start()
        except RuntimeError as error:
            cluster.stop(timeout=1)
            if "address already in use" not in str(error) or attempt == 2:
                raise
            continue
        return cluster
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def etcd_server(
    etcd_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EtcdCluster]:
    """One etcd member shared by the whole test session (tests use distinct prefixes)."""
    cluster = start_cluster(etcd_binary, tmp_path_factory.mktemp("etcd"), 1)
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_cluster(etcd_binary: str, tmp_path: Path) -> Iterator[EtcdCluster]:
    """A fresh 3-member etcd cluster; members can be killed and restarted."""
    cluster = start_cluster(etcd_binary, tmp_path / "etcd", 3)
    yield cluster
    cluster.stop(timeout=1)  # its data is thrown away: no need to wait for a clean exit


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix no other test uses, so tests can share one etcd."""
    return f"/aioelastic-test/{uuid.uuid4().hex}/"


@pytest.fixture
async def etcd_store(
    anyio_backend: Any, etcd_server: EtcdCluster, etcd_prefix: str
) -> AsyncIterator[Any]:
    """An open EtcdStore on the session's etcd (asyncio only: its gRPC client is)."""
    if _backend_name(anyio_backend) != "asyncio":
        pytest.skip("EtcdStore is asyncio-only (grpc.aio does not run on trio)")
    from aioelastic.store import EtcdStore

    async with EtcdStore(etcd_server.endpoints, prefix=etcd_prefix, timeout=30) as store:
        yield store
