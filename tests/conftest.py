"""Run every asyncio test on the stock loop and on uvloop; anyio tests also on trio.

Every test fails that makes a call which may block (a DNS lookup, ``time.sleep``) on a thread
running an event loop: see :mod:`tests.blocking`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.blocking import BlockingCalls

pytest_plugins = ["tests.etcd_fixtures"]

# Hypothesis fails an example that takes over 200 ms (or calls the test flaky when its rerun is
# quick): a timing threshold, which a loaded machine crosses. Speed is measured in bench/.
settings.register_profile("aioelastic", deadline=None)
settings.load_profile("aioelastic")

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


_BLOCKING = BlockingCalls()


@pytest.fixture(scope="session", autouse=True)
def _guard_installed() -> Iterator[BlockingCalls]:
    with _BLOCKING.installed() as calls:
        yield calls


def _fail_on_blocking_calls() -> None:
    found, _BLOCKING.found[:] = list(_BLOCKING.found), []
    if found:
        pytest.fail("blocking call(s) on the event loop:\n" + "\n".join(found), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fail the test itself when its body blocked an event loop's thread."""
    result = yield
    _fail_on_blocking_calls()
    return result


@pytest.fixture(autouse=True)
def no_blocking_call_on_the_event_loop(_guard_installed: BlockingCalls) -> Iterator[None]:
    """Fail the test if its fixtures blocked an event loop's thread."""
    _guard_installed.found.clear()
    yield
    _fail_on_blocking_calls()
