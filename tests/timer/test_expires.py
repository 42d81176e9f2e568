"""``expires()`` and ``configure()`` against a real in-process server (LocalTimerServer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextvars import ContextVar

import anyio
import pytest

from aioelastic import timer
from aioelastic.testing import ManualClock
from aioelastic.timer import (
    LocalTimerClient,
    LocalTimerServer,
    NoTimerClientError,
    ScopeExpiredError,
    TimerAcquired,
    TimerExpired,
    TimerReaped,
    TimerReleased,
)
from aioelastic.timer import _api as api_module

from .conftest import Recorder

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_default_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with a default-client variable of its own, unset."""
    monkeypatch.setattr(api_module, "_default_client", ContextVar("test default", default=None))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
async def client(recorder: Recorder, clock: ManualClock) -> AsyncIterator[LocalTimerClient]:
    async with LocalTimerServer("test", on_event=recorder, clock=clock) as server:
        yield server.client()


def scopes(
    recorder: Recorder, kind: type[TimerAcquired | TimerReleased | TimerReaped]
) -> list[str]:
    return [e.scope_id for e in recorder.of(kind)]


async def test_block_acquires_then_releases(recorder: Recorder, client: LocalTimerClient) -> None:
    """An async block arms one timer on entry and releases the same scope on exit."""
    async with timer.expires(after=60, scope="step", client=client):
        pass
    await recorder.wait_count(TimerReleased, 1)
    assert scopes(recorder, TimerAcquired) == ["step"]
    assert scopes(recorder, TimerReleased) == ["step"]


async def test_exception_propagates_and_timer_is_released(
    recorder: Recorder, client: LocalTimerClient
) -> None:
    """An exception inside the block reaches the caller and the timer is still released."""
    with pytest.raises(ValueError, match="boom"):
        async with timer.expires(after=60, scope="step", client=client):
            raise ValueError("boom")
    await recorder.wait_count(TimerReleased, 1)


async def test_sync_block_propagates_exceptions_too(
    recorder: Recorder, client: LocalTimerClient
) -> None:
    """The plain ``with`` form also releases its timer when the block raises."""
    with pytest.raises(KeyError), timer.expires(after=60, scope="s", client=client):
        raise KeyError("x")
    await recorder.wait_count(TimerReleased, 1)


def test_no_client_configured_is_a_clear_error() -> None:
    """Without a configured or passed client, expires() says what to do."""
    with pytest.raises(NoTimerClientError, match=r"call aioelastic\.timer\.configure"):
        timer.expires(after=1)


async def test_configured_client_is_the_default(
    recorder: Recorder, client: LocalTimerClient
) -> None:
    """After configure(client), expires() without client= uses it."""
    timer.configure(client)
    async with timer.expires(after=60, scope="configured"):
        pass
    await recorder.wait_count(TimerReleased, 1)
    assert scopes(recorder, TimerAcquired) == ["configured"]


async def test_explicit_client_overrides_the_configured_one(
    recorder: Recorder, client: LocalTimerClient, clock: ManualClock
) -> None:
    """A client passed to expires() is used instead of the configured default."""
    other = Recorder()
    async with LocalTimerServer("other", on_event=other, clock=clock) as server:
        timer.configure(server.client())
        async with timer.expires(after=60, scope="explicit", client=client):
            pass
        await recorder.wait_count(TimerReleased, 1)
    assert other.events == []


async def test_each_task_keeps_the_client_it_configured(
    recorder: Recorder, client: LocalTimerClient, clock: ManualClock
) -> None:
    """configure() in one task sets the default for it and the tasks it starts afterwards,
    not for a sibling that configured another client."""
    other = Recorder()
    configured = anyio.Event()
    async with LocalTimerServer("other", on_event=other, clock=clock) as server:

        async def uses_the_other_server() -> None:
            timer.configure(server.client())
            configured.set()
            async with anyio.create_task_group() as children:
                children.start_soon(expire_block, "child of other")

        async def expire_block(scope: str) -> None:
            async with timer.expires(after=60, scope=scope):
                pass

        async def uses_the_fixture_client() -> None:
            timer.configure(client)
            await configured.wait()  # after the sibling's configure()
            await expire_block("fixture")

        async with anyio.create_task_group() as tg:
            tg.start_soon(uses_the_other_server)
            tg.start_soon(uses_the_fixture_client)
        await other.wait_count(TimerReleased, 1)
    await recorder.wait_count(TimerReleased, 1)
    assert scopes(recorder, TimerAcquired) == ["fixture"]
    assert scopes(other, TimerAcquired) == ["child of other"]


async def test_default_scope_names_the_line_and_is_unique(
    recorder: Recorder, client: LocalTimerClient
) -> None:
    """Default scopes start with this file's name and never repeat for the same line."""
    for _ in range(3):
        async with timer.expires(after=60, client=client):
            pass
    await recorder.wait_count(TimerReleased, 3)
    names = scopes(recorder, TimerAcquired)
    assert len(set(names)) == 3
    assert all(name.startswith(__file__ + ":") for name in names)


async def test_recursion_gets_a_timer_per_level(
    recorder: Recorder, client: LocalTimerClient
) -> None:
    """Nested (recursive) blocks hold distinct timers, all live at the deepest point."""
    held: list[int] = []

    async def descend(depth: int) -> None:
        async with timer.expires(after=60, client=client):
            if depth == 0:
                await recorder.wait_count(TimerAcquired, 5)
                held.append(len(recorder.of(TimerAcquired)) - len(recorder.of(TimerReleased)))
            else:
                await descend(depth - 1)

    await descend(4)
    await recorder.wait_count(TimerReleased, 5)
    assert held == [5]
    assert len(set(scopes(recorder, TimerAcquired))) == 5


async def test_concurrent_tasks_never_share_a_scope(
    recorder: Recorder, client: LocalTimerClient
) -> None:
    """Many tasks entering the same line concurrently each get their own timer."""
    all_in = anyio.Event()

    async def worker() -> None:
        async with timer.expires(after=60, client=client):
            await all_in.wait()

    async with anyio.create_task_group() as group:
        for _ in range(50):
            group.start_soon(worker)
        await recorder.wait_count(TimerAcquired, 50)
        all_in.set()
    await recorder.wait_count(TimerReleased, 50)
    assert len(set(scopes(recorder, TimerReleased))) == 50


async def test_threads_never_share_a_scope(recorder: Recorder, client: LocalTimerClient) -> None:
    """Synchronous blocks in many threads each arm and release their own timer."""

    def work() -> None:
        with timer.expires(after=60, client=client):
            pass

    async with anyio.create_task_group() as group:
        for _ in range(10):
            group.start_soon(anyio.to_thread.run_sync, work)
    await recorder.wait_count(TimerReleased, 10)
    assert len(set(scopes(recorder, TimerReleased))) == 10


async def test_expired_async_block_is_cancelled(
    recorder: Recorder, client: LocalTimerClient, clock: ManualClock
) -> None:
    """A local server cancels an overdue async block, which raises ScopeExpiredError."""

    async def advance_once_armed() -> None:
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(61)

    async with anyio.create_task_group() as group:
        group.start_soon(advance_once_armed)
        with pytest.raises(ScopeExpiredError, match="'hung' did not finish within 60 s"):
            async with timer.expires(after=60, scope="hung", client=client):
                await anyio.sleep_forever()
    assert scopes(recorder, TimerReaped) == ["hung"]


async def test_block_finishing_in_time_is_not_cancelled(
    recorder: Recorder, client: LocalTimerClient, clock: ManualClock
) -> None:
    """Time passing short of the deadline leaves the block alone."""
    async with timer.expires(after=60, scope="quick", client=client):
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(59)
    await recorder.wait_count(TimerReleased, 1)
    clock.advance(10)
    assert recorder.of(TimerExpired) == []


async def test_expired_sync_block_is_reported_not_interrupted(
    recorder: Recorder, client: LocalTimerClient, clock: ManualClock
) -> None:
    """A synchronous block cannot be cancelled: its expiry is reported, nothing is reaped."""
    with timer.expires(after=5, scope="sync", client=client):
        await recorder.wait_count(TimerAcquired, 1)
        clock.advance(6)
        await recorder.wait_count(TimerExpired, 1)
    assert recorder.of(TimerReaped) == []


def test_local_client_needs_a_serving_server() -> None:
    """Asking a LocalTimerServer for a client before it serves is a clear error."""
    with pytest.raises(RuntimeError, match=r"client\(\) needs the server to be serving"):
        LocalTimerServer("idle").client()


async def test_local_server_counts_requests(recorder: Recorder, clock: ManualClock) -> None:
    """statistics() counts acquires, releases, expiries and reaps of in-process timers."""
    async with LocalTimerServer("stats", on_event=recorder, clock=clock) as server:
        client = server.client()
        async with timer.expires(after=60, scope="a", client=client):
            pass
        await client.acquire("b", 0.0)  # already past: expires at once, nothing to cancel
        await recorder.wait_count(TimerExpired, 1)
        stats = server.statistics()
    assert (stats.acquires, stats.releases, stats.expired, stats.reaped) == (2, 1, 1, 0)
    assert stats.active_timers == 0


@pytest.mark.parametrize("after", [-1.0, float("nan"), float("inf")])
def test_duration_must_be_finite_and_not_negative(
    after: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """expires() refuses a negative, NaN or infinite duration, naming the value."""
    with pytest.raises(timer.InvalidDurationError, match=f"after must be a finite .*got {after}"):
        timer.expires(after=after, client=timer.FileTimerClient("/nonexistent"))
