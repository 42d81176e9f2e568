"""The etcd extra is optional: the store imports without it; EtcdStore names what to install."""

from __future__ import annotations

import subprocess
import sys

_WITHOUT_EXTRA = """
import sys
sys.modules["aetcd"] = None  # as if aioelastic[etcd] were not installed
sys.modules["grpc"] = None
import aioelastic.store as store
assert "EtcdStore" in store.__all__
try:
    store.EtcdStore("127.0.0.1:2379")
except ImportError as error:
    print(error)
else:
    raise SystemExit("EtcdStore was constructed without its client library")
"""


def test_without_the_extra_constructing_says_which_extra_to_install() -> None:
    """Without aetcd, aioelastic.store imports and EtcdStore() names the pip extra."""
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA], capture_output=True, text=True, check=True
    )
    assert "pip install 'aioelastic[etcd]'" in result.stdout


def test_importing_the_store_package_does_not_load_grpc() -> None:
    """EtcdStore is imported on first use, so other stores never pay for gRPC."""
    code = "import sys, aioelastic.store; print('grpc' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
