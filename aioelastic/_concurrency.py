"""Concurrency helpers written once: the "first of N" race and exception-group unwrapping.

A task group reports its children's errors as an exception group, even a lone one. Inside a
component that is an implementation detail, so each component unwraps once, where its own
task group meets its caller (:class:`aioelastic._service.Service` does it for every
``async with`` component): callers catch ``OSError`` or ``StoreError``, not a group.
:func:`first_of` races waiters and hands back the winner's result or error as itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio

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
