"""Warm spares under ``--recovery in-place``: a spare holds what the workers loaded."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.agent import _generations as g
from aioelastic.agent._recovery import InPlaceGroup, _Linked
from aioelastic.worker._link import Link
from aioelastic.worker._protocol import NoMoreWorlds, Warm, chunked
from tests.agent.conftest import BOUND, launched

pytestmark = pytest.mark.anyio

WORKER = str(Path(__file__).parent / "workers" / "warm_plain.py")


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


async def test_a_spare_imports_what_the_workers_loaded_in_their_first_step(
    tmp_path: Path,
) -> None:
    """The workers import colorsys in their first step; the spare imports it while idle, so
    when it takes the place of a killed worker it holds colorsys before its first step."""
    finish = tmp_path / "finish"
    argv = ["--standalone", "--nproc-per-node", "2", "--recovery", "in-place", "--spares", "1"]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv, WORKER, str(finish)) as run:
            await run.err.wait_for("warming: imported")
            victim = int(re.findall(r"gen 1 rank 1 pid (\d+)", run.out.text)[0])
            os.kill(victim, signal.SIGKILL)
            await run.out.wait_for("gen 2 rank 1 pid")
            # the survivor is in generation 2 too: one still in generation 1 that saw FILE
            # would end its training there, while generation 2 forms
            await run.out.wait_for("gen 2 rank 0 pid")
            finish.touch()
            status = await run.wait()
    assert status == 0, run
    assert re.search(r"gen 1 rank 1 pid \d+ holds colorsys False", run.out.text)
    assert re.search(r"gen 2 rank 1 pid \d+ holds colorsys True", run.out.text)
    assert re.search(r"gen 2 rank 0 pid \d+ holds colorsys True", run.out.text)


async def test_a_list_longer_than_the_link_buffer_arrives_whole_and_in_order() -> None:
    """The agent's end takes part of a long Warm list (a small buffer the spare has not read
    yet); the rest follows as the spare reads, and a later message comes after it, whole."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    key = g.WorkerKey(0, 1)
    group = InPlaceGroup.__new__(InPlaceGroup)  # only its links: no processes here
    group._linked = {key: _Linked(key, None, ours, None)}  # type: ignore[arg-type]
    group._pump_scopes = []
    names = [f"package{n}.module{n}" for n in range(20000)]
    with anyio.fail_after(BOUND), ours:
        async with anyio.create_task_group() as tg:
            group._pumps = tg
            for message in chunked(Warm, names):
                group._send(key, message)
            group._send(key, NoMoreWorlds("the job finished"))
            assert group._linked[key].unsent  # the buffer could not take it all at once
            link = Link(theirs)
            while link.no_more is None:
                await link.wait_async()
            link.close()
    assert link.warm == names
    assert link.no_more == "the job finished"
