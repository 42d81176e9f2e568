"""DDP under ``--recovery in-place``: a warm spare, the state handed over, the same weights."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.conftest import BOUND, launched

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

WORKER = str(Path(__file__).parent / "workers" / "inplace_ddp.py")
EXAMPLES = Path(__file__).parents[2] / "examples"
IN_PLACE = ["--standalone", "--nproc-per-node", "2", "--recovery", "in-place", "--spares", "1"]


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


def weights(path: Path) -> dict[str, Any]:
    import torch

    loaded: dict[str, Any] = torch.load(path)
    return loaded


async def test_a_kill_9_with_a_spare_loses_no_step_and_takes_none_twice(tmp_path: Path) -> None:
    """Rank 1 is killed at step 7 once the spare is warm: the spare, handed the state by rank 0,
    held torch._dynamo before its DDP, and the final weights equal those of a run without the
    kill, bit for bit."""
    import torch

    gate = tmp_path / "gate"
    os.mkfifo(gate)
    with anyio.fail_after(BOUND * 4):
        async with launched(*IN_PLACE, WORKER, str(tmp_path / "calm.pt"), cwd=tmp_path) as run:
            assert await run.wait() == 0, run
        (tmp_path / "checkpoint.pt").unlink()
        argv = [*IN_PLACE, WORKER, "--kill-at", "7", "--gate", str(gate), str(tmp_path / "hit.pt")]
        async with launched(*argv, cwd=tmp_path) as run:
            await run.err.wait_for("warming: imported")
            await anyio.Path(gate).write_text("go\n")
            status = await run.wait()
    assert status == 0, run
    assert "killed by SIGKILL" in run.err.text
    assert "generation 2 formed" in run.err.text
    assert "restarting the worker group" not in run.err.text
    assert "warm fresh rank 1: torch._dynamo True" in run.out.text
    calm, hit = weights(tmp_path / "calm.pt"), weights(tmp_path / "hit.pt")
    assert calm.keys() == hit.keys()
    for name in calm:
        assert torch.equal(calm[name], hit[name]), name


async def test_the_torchrun_script_and_its_in_place_port_train_alike(tmp_path: Path) -> None:
    """examples/ddp_torchrun.py under torchrun and examples/ddp_inplace.py under in-place
    recovery with a spare end with the same weights."""
    import torch

    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    script = str(EXAMPLES / "ddp_torchrun.py")
    with anyio.fail_after(BOUND * 4):
        (tmp_path / "a").mkdir()
        async with launched(
            "--standalone",
            "--nproc-per-node",
            "2",
            script,
            "w.pt",
            launcher=torchrun,
            cwd=tmp_path / "a",
        ) as run:
            assert await run.wait() == 0, run
        (tmp_path / "b").mkdir()
        inplace = str(EXAMPLES / "ddp_inplace.py")
        async with launched(*IN_PLACE, inplace, "w.pt", cwd=tmp_path / "b") as run:
            assert await run.wait() == 0, run
    theirs, ours = weights(tmp_path / "a" / "w.pt"), weights(tmp_path / "b" / "w.pt")
    assert all(torch.equal(theirs[name], ours[name]) for name in theirs)
