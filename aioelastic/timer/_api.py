"""The client side every timer shares: ``TimerClient``, ``configure`` and ``expires``."""

from __future__ import annotations

import abc
import math
import sys
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Literal

import anyio

from aioelastic.timer._errors import InvalidDurationError, NoTimerClientError, ScopeExpiredError
from aioelastic.timer._learned import LearnedTimeouts, default_learned
from aioelastic.timer._stackdump import register_stack_dump


class TimerClient(abc.ABC):
    """Arms and releases countdown timers of the calling process on a timer server.

    ``expiration_time`` is an absolute wall-clock time (``time.time()``), as in PyTorch. The
    async methods serve coroutines; the ``_sync`` ones serve plain synchronous code and threads.
    """

    @abc.abstractmethod
    async def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm (or re-arm) the timer for ``scope_id`` to expire at ``expiration_time``."""

    @abc.abstractmethod
    async def release(self, scope_id: str) -> None:
        """Disarm the timer for ``scope_id``; releasing an unknown scope is a no-op."""

    @abc.abstractmethod
    def acquire_sync(self, scope_id: str, expiration_time: float) -> None:
        """Blocking form of :meth:`acquire`, for synchronous code."""

    @abc.abstractmethod
    def release_sync(self, scope_id: str) -> None:
        """Blocking form of :meth:`release`, for synchronous code."""

    async def acquire_cancellable(
        self, scope_id: str, expiration_time: float, cancel: Callable[[], None]
    ) -> None:
        """Like :meth:`acquire`; in-process servers call ``cancel`` on expiry, others ignore it."""
        await self.acquire(scope_id, expiration_time)


_default_client: ContextVar[TimerClient | None] = ContextVar(
    "aioelastic.timer default client", default=None
)
"""The client ``expires()`` uses when none is passed, per context: two servers in one process
(tests, in-process jobs) each serve the tasks that configured them."""


def configure(client: TimerClient | None) -> None:
    """Set the client ``expires()`` uses when none is passed (``None`` unsets it).

    The default belongs to the current context: this task and the tasks and ``to_thread``
    threads it starts afterwards, or, called at module level, the whole program's main thread.
    A ``threading.Thread`` starts with no default: pass ``client=`` or configure it there.
    Under ``aioelastic run`` this also registers the agent's stack-dump signal with
    ``faulthandler`` (see ``_stackdump.py``).
    """
    _default_client.set(client)
    if client is not None:
        register_stack_dump()  # lets the agent dump this worker's stacks if py-spy cannot


class Expiry:
    """A timer armed for the duration of a block: ``with`` or ``async with`` (see ``expires``).

    With ``learned``, a block that finishes is an observation of its scope's duration.
    """

    def __init__(
        self,
        after: float,
        scope_id: str,
        client: TimerClient,
        learned: LearnedTimeouts | None = None,
    ) -> None:
        self.after = after
        self.scope_id = scope_id
        self.client = client
        self.learned = learned
        self._cancel_scope: anyio.CancelScope | None = None
        self._started = 0.0

    def _observe(self, exc_type: type[BaseException] | None) -> None:
        if self.learned is not None and exc_type is None:
            self.learned.observe(self.scope_id, self.learned.now() - self._started)

    def __enter__(self) -> Expiry:
        self.client.acquire_sync(self.scope_id, time.time() + self.after)
        if self.learned is not None:
            self._started = self.learned.now()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.client.release_sync(self.scope_id)
        self._observe(exc_type)

    async def __aenter__(self) -> Expiry:
        scope = anyio.CancelScope()
        scope.__enter__()
        try:
            await self.client.acquire_cancellable(
                self.scope_id, time.time() + self.after, scope.cancel
            )
        except BaseException:
            scope.__exit__(None, None, None)
            raise
        self._cancel_scope = scope
        if self.learned is not None:
            self._started = self.learned.now()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        scope, self._cancel_scope = self._cancel_scope, None
        assert scope is not None, "Expiry exited without being entered"
        try:
            with anyio.CancelScope(shield=True):
                await self.client.release(self.scope_id)
        finally:
            scope.__exit__(exc_type, exc, tb)
        if scope.cancelled_caught:
            raise ScopeExpiredError(self.scope_id, self.after) from exc
        self._observe(exc_type)
        return False


def expires(
    after: float | Literal["auto"],
    scope: str | None = None,
    client: TimerClient | None = None,
    *,
    learned: LearnedTimeouts | None = None,
) -> Expiry:
    """Arm a timer that expires ``after`` seconds from now unless the block finishes first.

    Use as ``async with expires(after=30):`` in coroutines or ``with expires(after=30):`` in
    synchronous code. The default ``scope`` names the calling line and is unique per call, so
    nested, recursive and concurrent uses never share a timer. An exception in the block
    propagates and the timer is still released. ``after="auto"`` learns the limit from the
    scope's earlier blocks (a named ``scope`` is needed; see ``_learned.py``), with ``learned``
    or the process's default learner (kept where the agent says).
    """
    if after == "auto":
        if scope is None:
            raise InvalidDurationError("after", after, 'after="auto" needs a named scope to learn')
        learned = learned if learned is not None else default_learned()
        after = learned.limit(scope)
    elif not isinstance(after, int | float) or not math.isfinite(after) or after < 0:
        raise InvalidDurationError("after", after)
    else:
        learned = None
    chosen = client if client is not None else _default_client.get()
    if chosen is None:
        raise NoTimerClientError
    if scope is None:
        frame = sys._getframe(1)
        scope = f"{frame.f_code.co_filename}:{frame.f_lineno}#{uuid.uuid4().hex[:12]}"
    return Expiry(after, scope, chosen, learned)
