"""etcd tests run on asyncio and uvloop only: the etcd client (grpc.aio) does not run on trio."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

_BACKENDS = [pytest.param(("asyncio", {}), id="asyncio")]
if importlib.util.find_spec("uvloop") is not None:
    _BACKENDS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param
