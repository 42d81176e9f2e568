"""The client's one alarm for all its calls' deadlines (asyncio), without a server."""

from __future__ import annotations

import asyncio

import pytest

from aioelastic.store._tcp_transport import Alarm, FutureSignal

pytestmark = pytest.mark.asyncio


async def test_an_earlier_deadline_rearms_the_alarm_and_wakes_only_its_call() -> None:
    """A call due now wakes at once; one due much later keeps waiting, and the alarm moves on
    to its deadline; a call that ended early and was forgotten leaves nothing behind."""
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    later, due, ended = FutureSignal(alarm), FutureSignal(alarm), FutureSignal(alarm)
    waits = [
        asyncio.ensure_future(later.wait(loop.time() + 3600)),
        asyncio.ensure_future(ended.wait(loop.time() + 1800)),
    ]
    await asyncio.sleep(0)  # both registered
    ended.set()
    await waits[1]
    ended.forget()
    async with asyncio.timeout(30):  # generous: it rings on the next loop turn
        await due.wait(loop.time() - 1)  # returns only if the alarm rang for it
    due.forget()
    assert (later.future.done(), list(alarm.waiting), alarm.at) == (
        False,
        [later],
        alarm.waiting[later],
    )
    waits[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waits[0]
    later.forget()
    assert alarm.waiting == {}
