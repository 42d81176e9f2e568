"""What a new user meets in the first hour of ``aioelastic run`` (issue 39), done as they did it:
real launcher processes, real ports."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.conftest import BOUND, TORCHRUN, free_port, launched

pytestmark = pytest.mark.anyio

ENV_DUMP = """
import json, os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as out:
    json.dump(dict(os.environ), out)
"""
"""A worker that writes its environment to DIR/RANK."""


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


async def failed_launch(*argv: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``aioelastic run ARGV`` in ``cwd`` to its end; return status, stdout, stderr."""
    with anyio.fail_after(BOUND):
        async with launched(*argv, cwd=cwd) as run:
            status = await run.wait()
            await run.err.wait_closed()
    return status, run.out.text, run.err.text


async def test_a_missing_training_script_is_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    """``run --nproc-per-node 2 does_not_exist.py``: one line naming it, exit 2, no workers."""
    status, out, err = await failed_launch(
        "--nproc-per-node", "2", "does_not_exist.py", cwd=tmp_path
    )
    expected = (
        f"aioelastic run: error: the training script 'does_not_exist.py' does not exist in "
        f"{tmp_path} (see 'aioelastic run --help')\n"
    )
    assert (status, out, err) == (2, "", expected)


async def test_an_unknown_flag_of_run_shows_runs_usage(tmp_path: Path) -> None:
    """An unknown flag before the script is reported with ``run``'s usage, not the top level's."""
    (tmp_path / "train.py").write_text("print('the worker ran')\n")
    status, out, err = await failed_launch("--gpus", "train.py", cwd=tmp_path)
    expected = (
        "usage: aioelastic run [options] TRAINING_SCRIPT [ARGS ...]\n"
        "aioelastic run: error: unrecognized arguments: --gpus\n"
    )
    assert (status, out, err) == (2, "", expected)


async def test_no_script_names_only_the_script_as_missing(tmp_path: Path) -> None:
    """``aioelastic run`` alone asks for TRAINING_SCRIPT (its arguments are optional)."""
    status, out, err = await failed_launch(cwd=tmp_path)
    expected = (
        "aioelastic run: error: the following arguments are required: TRAINING_SCRIPT "
        "(see 'aioelastic run --help')\n"
    )
    assert (status, out, err) == (2, "", expected)


async def worker_envs(*argv: str, where: Path, launcher: Any = None) -> list[dict[str, str]]:
    """The environments of the two workers of ``[launcher] ARGV --nproc-per-node 2 ENV_DUMP``."""
    script, dumps = where / "env_dump.py", where / "envs"
    script.write_text(ENV_DUMP)
    dumps.mkdir()
    with anyio.fail_after(BOUND):
        argv = (*argv, "--nproc-per-node", "2", str(script), str(dumps))
        async with launched(*argv, cwd=where, launcher=launcher) as run:
            status = await run.wait()
    assert status == 0, run
    return [json.loads((dumps / str(rank)).read_text()) for rank in (0, 1)]


async def test_a_default_single_node_run_gives_its_workers_a_run_id(tmp_path: Path) -> None:
    """No rendezvous flags, one node: the workers share a fresh run id, as under torchrun."""
    envs = await worker_envs(where=tmp_path)
    run_ids = {env["TORCHELASTIC_RUN_ID"] for env in envs}
    assert len(run_ids) == 1
    assert str(uuid.UUID(run_ids.pop())) == envs[0]["TORCHELASTIC_RUN_ID"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), "SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
        (("--signals-to-handle", "TERM,usr1"), "SIGTERM,SIGUSR1"),
    ],
)
async def test_workers_are_told_the_signals_the_launcher_handles(
    flags: tuple[str, ...], expected: str, tmp_path: Path
) -> None:
    """TORCHELASTIC_SIGNALS_TO_HANDLE names the launcher's --signals-to-handle, as torchrun's."""
    envs = await worker_envs("--standalone", *flags, where=tmp_path)
    assert [env["TORCHELASTIC_SIGNALS_TO_HANDLE"] for env in envs] == [expected, expected]


PER_LAUNCH = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
"""Variables whose value is the launch's own (a port, an id, a path; torchrun's MASTER_ADDR is
``localhost``, ours the address the store listens on); every other one must be torchrun's."""


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("flags", [(), ("--standalone",)], ids=["default", "standalone"])
async def test_workers_get_every_variable_torchrun_gives_them(
    flags: tuple[str, ...], tmp_path: Path
) -> None:
    """The full worker environment of torchrun (2.13) is ours too: same names, same values but
    a launch's own ports, ids and paths; both give a single-node run a fresh run id."""
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "aioelastic").mkdir()
    theirs = await worker_envs(*flags, where=tmp_path / "torchrun", launcher=TORCHRUN)
    ours = await worker_envs(*flags, where=tmp_path / "aioelastic")
    for their, our in zip(theirs, ours, strict=True):
        assert sorted(set(their) - set(our)) == []
        same = sorted(set(their) - PER_LAUNCH)
        assert [(k, our[k]) for k in same] == [(k, their[k]) for k in same]
        for env in (their, our):
            assert str(uuid.UUID(env["TORCHELASTIC_RUN_ID"])) == env["TORCHELASTIC_RUN_ID"]


@pytest.mark.parametrize("backend", ["c10d", "static"])
async def test_a_busy_local_endpoint_is_one_line_saying_so(backend: str, tmp_path: Path) -> None:
    """Another program listens on the local endpoint (it never answers): c10d, like static,
    says the address is in use, in one line, without trying to reach a store there for 60 s."""
    (tmp_path / "train.py").write_text("print('the worker ran')\n")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        if backend == "c10d":
            flags = ["--nnodes", "1:2", "--rdzv-backend", "c10d"]
            flags += ["--rdzv-endpoint", f"127.0.0.1:{port}"]
            why = " (by a program that did not answer as a rendezvous store within 5 s)"
        else:
            flags = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"]
            flags += ["--master-port", str(port)]
            why = ""
        status, out, err = await failed_launch(*flags, "train.py", cwd=tmp_path)
    expected = (
        f"aioelastic run: cannot serve the rendezvous store on 127.0.0.1:{port}: [Errno 98] "
        f"error while attempting to bind on address ('127.0.0.1', {port}): address already in "
        f"use{why}; free the port or choose another endpoint\n"
    )
    assert (status, out, err) == (1, "", expected)


async def test_a_static_node_waiting_for_its_master_says_so_every_5_s(tmp_path: Path) -> None:
    """Node rank 1 started before its master: a progress line every 5 s names the store it
    waits for; once node rank 0 starts, the job runs."""
    (tmp_path / "train.py").write_text("print('the worker ran')\n")
    port = free_port()

    def argv(node_rank: int) -> list[str]:
        return ["--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1"]

    static = ["--master-addr", "127.0.0.1", "--master-port", str(port), "train.py"]
    waiting = (
        rf"\[aioelastic\] rendezvous 'none': node 1 waiting (\d+) s for the rendezvous store at "
        rf"127\.0\.0\.1:{port} \(node rank 0 serves it\); join timeout in (\d+) s\n"
    )
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv(1), *static, cwd=tmp_path) as late:
            await late.err.wait_for("[aioelastic] rendezvous 'none'", count=2)
            async with launched(*argv(0), *static, cwd=tmp_path) as master:
                statuses = [await master.wait(), await late.wait()]
    assert statuses == [0, 0], (master, late)
    reports = [(int(w), int(left)) for w, left in re.findall(waiting, late.err.text)]
    assert [waited for waited, _ in reports[:2]] == [5, 10]
    assert all(595 - waited <= left <= 600 - waited for waited, left in reports)
    assert late.out.text == master.out.text == "the worker ran\n"
