"""Every Python worker destroys torch's process group before its interpreter finalizes.

The SIGABRT at a worker's exit ("terminate called without an active exception") is a race in
torch: a gloo thread releasing a finished collective while the interpreter finalizes. A process
group destroyed at exit leaves it nothing to release (:mod:`aioelastic._process_group`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.agent._site import WORKER_SITE, without_worker_site, worker_site_env
from tests.agent.conftest import BOUND, free_port, launched, static_argv

WORKERS = Path(__file__).parent / "workers"
HAS_TORCH = importlib.util.find_spec("torch") is not None

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


def test_worker_site_leads_the_python_path_and_keeps_the_users() -> None:
    """The hook's directory goes first; the user's own PYTHONPATH follows it unchanged."""
    assert worker_site_env({}) == {"PYTHONPATH": WORKER_SITE}
    joined = os.pathsep.join([WORKER_SITE, "/a", "/b"])
    assert worker_site_env({"PYTHONPATH": os.pathsep.join(["/a", "/b"])}) == {"PYTHONPATH": joined}


def test_a_forked_worker_gets_the_path_the_hook_leaves() -> None:
    """without_worker_site undoes worker_site_env, and leaves any other path alone."""
    for given in ({}, {"PYTHONPATH": "/a"}, {"PYTHONPATH": os.pathsep.join(["/a", "/b"])}):
        env = {"HOME": "/root", **given}
        assert without_worker_site({**env, **worker_site_env(env)}) == env
    assert without_worker_site({"PYTHONPATH": "/a"}) == {"PYTHONPATH": "/a"}


async def test_a_worker_sees_its_own_path_and_its_own_sitecustomize(tmp_path: Path) -> None:
    """The hook leaves no trace on sys.path or PYTHONPATH, and a user's sitecustomize still runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("MARK = 'users'\n")
    with anyio.fail_after(BOUND):
        async with launched(
            "--standalone", str(WORKERS / "site_probe.py"), env={"PYTHONPATH": str(site)}
        ) as run:
            assert await run.wait() == 0, run
    assert "sitecustomize users" in run.out.text, run
    assert f"pythonpath {site}" in run.out.text, run
    assert "worker_site_on_path False" in run.out.text, run


def test_a_destroy_that_hangs_at_exit_is_cut_short(tmp_path: Path) -> None:
    """A process group whose destroy never returns (a peer hangs) does not keep the process."""
    script = tmp_path / "hangs.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time, types
            from aioelastic._process_group import install_exit_hook

            def destroy_process_group():
                time.sleep(3600)  # a collective still waiting for a hung peer

            dist = types.ModuleType("torch.distributed")
            dist.group = types.SimpleNamespace(WORLD=object())
            dist.is_available = lambda: True
            dist.is_initialized = lambda: True
            dist.destroy_process_group = destroy_process_group
            sys.modules["torch.distributed"] = dist
            install_exit_hook(timeout=0.5)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=BOUND, check=False
    )
    assert done.returncode == 1, done
    assert "destroy_process_group() at exit did not return within 0.5 s" in done.stderr


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
async def test_a_static_job_hands_workers_the_master_address_and_destroys_at_exit() -> None:
    """Default flags, static 2 nodes: workers get exactly --master-addr/--master-port (torchrun's
    arrangement) and each one's process group is destroyed at exit though it never asked."""
    port = free_port()

    def argv(node_rank: int) -> list[str]:
        return static_argv(port, node_rank, str(WORKERS / "exit_probe.py"))

    with anyio.fail_after(BOUND * 2):
        async with launched(*argv(0)) as first, launched(*argv(1)) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    for rank, agent in enumerate((first, second)):
        assert f"rank {rank} master 127.0.0.1:{port}" in agent.out.text, agent
        assert f"rank {rank} sum 2" in agent.out.text, agent
        assert f"rank {rank} destroyed at exit" in agent.out.text, agent


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
async def test_a_ddp_that_outlives_its_world_is_never_its_groups_last_owner(tmp_path: Path) -> None:
    """A DDP freed after its world's group was destroyed, while a gloo thread waits for the GIL
    to release the last all_reduce, does not join that thread with the GIL held (the rank that
    never exited, issue 37): the destroyed group is kept until the next destroy or exit."""
    store = str(tmp_path / "store")
    script = str(WORKERS / "ddp_last_owner.py")
    ranks = [[sys.executable, script, store, str(rank)] for rank in (0, 1)]
    with anyio.fail_after(BOUND):
        async with (
            await anyio.open_process(ranks[0], stderr=subprocess.STDOUT) as first,
            await anyio.open_process(ranks[1], stderr=subprocess.STDOUT) as second,
        ):
            assert first.stdout is not None
            out = b"".join([chunk async for chunk in first.stdout]).decode()
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], out
    assert "rank 0 freed its DDP" in out
