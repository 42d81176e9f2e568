"""etcd tests run on asyncio and uvloop only: the etcd client (grpc.aio) does not run on trio."""

from __future__ import annotations

from typing import Any

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test extra
    uvloop = None

_BACKENDS = [pytest.param(("asyncio", {}), id="asyncio")]
if uvloop is not None:
    _BACKENDS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param
