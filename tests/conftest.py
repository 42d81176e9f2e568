"""Run every asyncio test on the stock loop and on uvloop; anyio tests also on trio."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

pytest_plugins = ["tests.etcd_fixtures"]

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test extra
    uvloop = None


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


_ANYIO_BACKENDS = [pytest.param(("asyncio", {}), id="asyncio")]
if uvloop is not None:
    _ANYIO_BACKENDS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))
_ANYIO_BACKENDS.append(pytest.param(("trio", {}), id="trio"))


@pytest.fixture(params=_ANYIO_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param
