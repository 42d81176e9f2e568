"""Multi-host tests: hosts are network namespaces the tests make themselves.

Where namespaces cannot be made (not root, no ``ip``/``nft``), these tests skip with the
reason, except under CI (``CI=true``), where they fail: CI runs as root and must run them.
"""

from __future__ import annotations

import os

import pytest

from aioelastic.testing import unavailable_reason


@pytest.fixture
def anyio_backend() -> str:
    """Multi-host tests drive real processes; one loop is enough."""
    return "asyncio"


@pytest.fixture
def netns() -> None:
    """Skip (fail under CI) where network namespaces cannot be made."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but network namespaces cannot be made: {reason}")
        pytest.skip(f"network namespaces cannot be made: {reason}")
