"""Concurrency helpers written once: the "first of N" race, exception-group unwrapping, and
light background tasks.

A task group reports its children's errors as an exception group, even a lone one. Inside a
component that is an implementation detail, so each component unwraps once, where its own
task group meets its caller (:class:`aioelastic._service.Service` does it for every
``async with`` component): callers catch ``OSError`` or ``StoreError``, not a group.
:func:`first_of` races waiters and hands back the winner's result or error as itself.
:class:`LightTasks` runs cancellable background tasks that cost a bare asyncio task on asyncio.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup

T = TypeVar("T")


def lone_error(error: BaseException) -> BaseException:
    """The single exception behind ``error`` (through nested groups of one), else ``error``."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@contextmanager
def unwrap_single_error() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself (through nested groups of one), so
    callers catch what was raised; a group of several errors leaves as it is."""
    try:
        yield
    except BaseExceptionGroup as group:
        lone = lone_error(group)
        if lone is group:
            raise
        # Raised as it was: its own cause and context, not the group it travelled in.
        cause, context, suppress = lone.__cause__, lone.__context__, lone.__suppress_context__
        try:
            raise lone
        finally:
            lone.__cause__, lone.__context__ = cause, context
            lone.__suppress_context__ = suppress


async def first_of(*waiters: Callable[[], Awaitable[T]]) -> T:
    """Run ``waiters`` concurrently; the first to finish decides, and the others are cancelled.

    The winner's result is returned, or its exception raised as itself (not in a group); what
    the others raise while they are cancelled is dropped. The first waiter runs in the calling
    task (in its context), the others in tasks of their own: a race costs one task fewer,
    which counts where thousands of nodes share one process.
    """
    if not waiters:
        raise ValueError("first_of() needs at least one waiter")
    results: list[T] = []
    errors: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def run(waiter: Callable[[], Awaitable[T]]) -> None:
            try:
                result = await waiter()
            except Exception as error:
                if not (results or errors):
                    errors.append(error)
            else:
                if not (results or errors):
                    results.append(result)
            tg.cancel_scope.cancel()

        for waiter in waiters[1:]:
            tg.start_soon(run, waiter)
        await run(waiters[0])
    if errors:
        raise errors.pop()  # not kept here: the error's traceback holds this frame
    return results[0]


class Event(Protocol):
    """What :func:`new_event` returns: an event set once, waited on by any number of tasks.

    Unlike anyio's, asyncio's ``wait()`` on an event already set returns without yielding to
    the loop: a loop that waits again must find a fresh event, or it spins and holds the loop.
    """

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


def new_event() -> Event:
    """An event of the running loop's kind: asyncio's own on asyncio (anyio's wraps it, one
    object and one coroutine a waiter more), anyio's elsewhere."""
    return asyncio.Event() if asyncio._get_running_loop() is not None else anyio.Event()


Cancel = Callable[[], object]
"""Cancels what :meth:`LightTasks.start` started."""


class LightTasks:
    """Cancellable background tasks of an owner's task group, each a bare asyncio task on
    asyncio (a :class:`~anyio.CancelScope` in a task of the group elsewhere).

    An anyio task costs ~15 tracked objects beyond asyncio's own (its handle with a cancel
    scope, two sets and an event, its state, a wrapper coroutine, a done closure), and a scope
    to cancel it 4 more: where thousands of simulated nodes share one process, every object a
    waiting task holds is one more for each full collection to walk. A task started here is
    owned as the group's are: an error it raises is raised in ``tg``, and :meth:`aclose` (which
    the owner awaits before leaving ``tg``) cancels the tasks left and waits for them.
    """

    def __init__(self, tg: TaskGroup) -> None:
        self._tg = tg
        self._tasks: set[asyncio.Task[None]] = set()
        self._scopes: set[anyio.CancelScope] = set()  # on other backends
        self._on_done = self._done  # one bound method for every task, not one each

    def start(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> Cancel:
        """Start ``function(*args)``; return what cancels it (a no-op once it has ended)."""
        if asyncio._get_running_loop() is None:  # another backend: a scope in the group
            scope = anyio.CancelScope()
            self._scopes.add(scope)

            async def run() -> None:
                try:
                    with scope:
                        await function(*args)
                finally:
                    self._scopes.discard(scope)

            self._tg.start_soon(run)
            return scope.cancel
        context = contextvars.copy_context()  # the task's and its done callback's: one
        task = asyncio.get_running_loop().create_task(function(*args), context=context)
        task.add_done_callback(self._on_done, context=context)
        self._tasks.add(task)
        return task.cancel

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:

            async def reraise() -> None:
                raise error

            self._tg.start_soon(reraise)  # the group sees it as one of its own tasks' errors

    async def aclose(self) -> None:
        """Cancel the tasks left and wait until they have ended (shielded: owners call this
        on their way out, often while cancelled). On other backends the task group waits."""
        for scope in self._scopes:
            scope.cancel()
        if not self._tasks:
            return
        for task in self._tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait(set(self._tasks))
