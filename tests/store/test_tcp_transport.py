"""The client's one alarm for all its calls' deadlines (asyncio), without a server."""

from __future__ import annotations

import asyncio

import pytest

from aioelastic.store._tcp_transport import Alarm

pytestmark = pytest.mark.asyncio


async def test_an_earlier_deadline_rearms_the_alarm_and_wakes_only_its_call() -> None:
    """A call due now wakes at once; one due much later keeps waiting, and the alarm moves on
    to its deadline; a call that ended early and was forgotten leaves nothing behind."""
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    later, due, ended = alarm.signal(), alarm.signal(), alarm.signal()
    waits = [
        asyncio.ensure_future(alarm.wait(later, loop.time() + 3600)),
        asyncio.ensure_future(alarm.wait(ended, loop.time() + 1800)),
    ]
    await asyncio.sleep(0)  # both registered
    ended.set_result(None)
    await waits[1]
    alarm.forget(ended)
    async with asyncio.timeout(30):  # generous: it rings on the next loop turn
        await alarm.wait(due, loop.time() - 1)  # returns only if the alarm rang for it
    alarm.forget(due)
    assert (later.done(), list(alarm.waiting), alarm.at) == (
        False,
        [later],
        alarm.waiting[later],
    )
    waits[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waits[0]
    alarm.forget(later)
    assert alarm.waiting == {}


async def test_a_cancelled_callers_signal_is_not_set_again() -> None:
    """The alarm ringing for a call whose caller was cancelled (its future is done) leaves it
    alone instead of raising InvalidStateError in the loop's callback."""
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    gone = alarm.signal()
    deadline = loop.time() + 0.01
    waiting = asyncio.ensure_future(alarm.wait(gone, deadline))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    handler_calls: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: handler_calls.append(context))
    rang = loop.create_future()  # set after the alarm rang: timers run in time order
    loop.call_at(deadline + 0.001, rang.set_result, None)
    try:
        await rang
    finally:
        loop.set_exception_handler(None)
    assert (gone.cancelled(), alarm.waiting, handler_calls) == (True, {}, [])
