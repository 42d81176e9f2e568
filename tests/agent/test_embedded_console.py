"""Where an embedded agent's worker output goes: by default through the streams the agent was
given, each line prefixed with its rank (an embedding program shares its console with other
output, and a given stream can only be honoured by relaying); with ``inherit_console``
(``aioelastic run``'s and torchrun's way) the workers write to the console themselves."""

from __future__ import annotations

import sys

import anyio
import pytest

from aioelastic.agent import ElasticAgent, LogSpec, RunState, WorkerSpec
from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aioelastic.store import MemoryStore
from tests.agent.conftest import BOUND, Console

pytestmark = pytest.mark.anyio

SAY = "import os; os.write(1, f\"hello from {os.environ['RANK']}\\n\".encode())"
"""One write a line: two workers sharing a console must not interleave inside a line."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run_embedded(logs: LogSpec) -> Console:
    """Run two workers saying hello under an embedded agent; what reached its given stdout."""
    out = Console()
    params = RendezvousParameters("memory", "console", "job", 1, 1, store=MemoryStore())
    with anyio.fail_after(BOUND):
        async with get_rendezvous_handler(params) as handler:
            spec = WorkerSpec(
                sys.executable, handler, args=("-c", SAY), local_world_size=2, logs=logs
            )
            result = await ElasticAgent(spec, stdout=out, stderr=Console()).run()
    assert result.state is RunState.SUCCEEDED
    return out


async def test_by_default_lines_reach_the_given_stream_prefixed_with_the_rank() -> None:
    """The default LogSpec relays each worker's lines to the agent's stdout, rank first."""
    out = await run_embedded(LogSpec())
    assert sorted(out.text.splitlines()) == ["[0]: hello from 0", "[1]: hello from 1"]


async def test_inherit_console_leaves_the_console_to_the_workers(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """With inherit_console the workers write to the process's own stdout, unprefixed, and
    nothing passes through the agent's stream."""
    out = await run_embedded(LogSpec(inherit_console=True))
    assert out.text == ""
    assert sorted(capfd.readouterr().out.splitlines()) == ["hello from 0", "hello from 1"]
