"""The same script under ``torchrun`` and ``aioelastic run``: the same observable outcome."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.conftest import BOUND, TORCHRUN, WORKER, Launched, launched, on_terminal

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parents[2] / "examples"
PLAIN_FAILURE = str(EXAMPLES / "agent_run_path.py")
HAS_TORCH = importlib.util.find_spec("torch") is not None

LAUNCHERS = [
    pytest.param(None, id="aioelastic"),
    pytest.param(
        TORCHRUN,
        id="torchrun",
        marks=[
            pytest.mark.torch,
            pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed"),
        ],
    ),
]


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The tests only drive subprocesses."""
    return request.param


async def preempt(
    launcher: Sequence[str] | None, out: Path, signum: signal.Signals
) -> tuple[Launched, int]:
    """Start two preemptible workers (checkpoints in ``out``), signal the launcher once both
    train, and return the run with its exit status."""
    argv = ["--standalone", "--nproc-per-node", "2", str(EXAMPLES / "agent_preemption.py")]
    with anyio.fail_after(BOUND):
        async with launched(*argv, str(out), launcher=launcher) as run:
            await run.out.wait_for("training", count=2)
            run.send_signal(signum)
            status = await run.wait()
    return run, status


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_sigterm_lets_every_worker_print_and_save_its_checkpoint(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """SIGTERM to the launcher: both workers' handlers print, save a checkpoint, and exit."""
    run, status = await preempt(launcher, tmp_path, signal.SIGTERM)
    assert sorted(os.listdir(tmp_path)) == ["rank-0.ckpt", "rank-1.ckpt"], run
    for rank in range(2):
        assert f"rank {rank}: SIGTERM, saving a checkpoint" in run.out.text
        assert f"rank {rank}: checkpoint saved" in run.out.text
    if launcher is None:  # torchrun exits 1 here; we keep the Unix convention, 128 + signal
        assert status == 128 + signal.SIGTERM, run


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_sigint_shows_the_workers_keyboard_interrupt(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """SIGINT to the launcher reaches the workers; their KeyboardInterrupt tracebacks show."""
    run, status = await preempt(launcher, tmp_path, signal.SIGINT)
    assert run.err.text.count("KeyboardInterrupt") >= 2, run
    if launcher is None:
        assert status == 128 + signal.SIGINT, run


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_a_worker_gets_the_launchers_terminal(launcher: Sequence[str] | None) -> None:
    """Under a pseudo-terminal, a worker's stdin/stdout/stderr are that terminal: it can ask."""
    argv = ["--standalone", "--nproc-per-node", "1", str(EXAMPLES / "agent_terminal.py")]
    with anyio.fail_after(BOUND):
        async with on_terminal(*argv, launcher=launcher) as (process, terminal):
            await terminal.screen.wait_for("continue? ")
            terminal.type("yes\n")
            status = await process.wait()
        await terminal.screen.wait_closed()
    assert status == 0, terminal.screen.text
    assert "rank 0: stdin=True stdout=True stderr=True" in terminal.screen.text
    assert "progress 100%" in terminal.screen.text
    assert "answered 'yes'" in terminal.screen.text


def root_cause_in(path: Path) -> dict[str, Any]:
    """The launcher's error file, in torch's layout: its ``message`` object."""
    document = json.loads(path.read_text())
    return dict(document["message"])


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_the_root_cause_reaches_the_launchers_own_error_file(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """A worker's recorded error is copied to the launcher's TORCHELASTIC_ERROR_FILE."""
    own = tmp_path / "launcher-error.json"
    argv = ["--standalone", "--nproc-per-node", "2", WORKER, "--fail-rank", "1"]
    with anyio.fail_after(BOUND):
        async with launched(
            *argv, launcher=launcher, env={"TORCHELASTIC_ERROR_FILE": str(own)}
        ) as run:
            status = await run.wait()
    assert status == 1, run
    cause = root_cause_in(own)
    assert cause["message"] == "RuntimeError: rank 1 fails on attempt 0"
    assert "raise RuntimeError" in cause["extraInfo"]["py_callstack"]
    assert cause["errorCode"] == 1


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_run_path_records_the_traceback_of_a_script_without_record(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """--run-path: a plain script's uncaught exception is recorded, traceback and all."""
    own = tmp_path / "launcher-error.json"
    argv = ["--standalone", "--nproc-per-node", "2", "--run-path", PLAIN_FAILURE]
    with anyio.fail_after(BOUND):
        async with launched(
            *argv, launcher=launcher, env={"TORCHELASTIC_ERROR_FILE": str(own)}
        ) as run:
            status = await run.wait()
    assert status == 1, run
    cause = root_cause_in(own)
    assert cause["message"] == "RuntimeError: no batch for rank 1"
    assert "in load_batch" in cause["extraInfo"]["py_callstack"]
    if launcher is None:
        assert "error     : RuntimeError: no batch for rank 1" in run.err.text  # the report


async def test_a_worker_without_an_error_file_is_described_in_the_launchers(tmp_path: Path) -> None:
    """No @record, no --run-path: the launcher's error file still says who failed and how
    (torchrun writes none then)."""
    own = tmp_path / "launcher-error.json"
    argv = ["--standalone", "--nproc-per-node", "2", PLAIN_FAILURE]
    with anyio.fail_after(BOUND):
        async with launched(*argv, env={"TORCHELASTIC_ERROR_FILE": str(own)}) as run:
            status = await run.wait()
    assert status == 1, run
    cause = root_cause_in(own)
    assert (cause["message"], cause["errorCode"]) == ("rank 1 (local rank 1): exit code 1", 1)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is missing")
@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_nproc_cpu_respects_the_cpu_affinity(launcher: Sequence[str] | None) -> None:
    """Under taskset -c 0, --nproc-per-node cpu starts one worker, as under torchrun."""
    program = launcher or (sys.executable, "-m", "aioelastic", "run")
    argv = ["--standalone", "--nproc-per-node", "cpu", WORKER]
    with anyio.fail_after(BOUND):
        async with launched(*argv, launcher=["taskset", "-c", "0", *program]) as run:
            status = await run.wait()
    assert status == 0, run
    assert run.out.text.count("done rank=") == 1, run


def lines_of(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def recorded_envs(out: Path) -> list[dict[str, str]]:
    """The environments the scenario worker recorded, in rank order."""
    records = [json.loads(path.read_text()) for path in out.glob("*.json")]
    return sorted(records, key=lambda env: int(env["RANK"]))


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_virtual_local_rank_gives_each_worker_device_0_of_its_own(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """--virtual-local-rank: LOCAL_RANK=0, CUDA_VISIBLE_DEVICES picked from the agent's list."""
    argv = ["--standalone", "--nproc-per-node", "2", "--virtual-local-rank"]
    env = {"CUDA_VISIBLE_DEVICES": "3,5"}
    with anyio.fail_after(BOUND):
        async with launched(
            *argv, WORKER, "--out", str(tmp_path), launcher=launcher, env=env
        ) as run:
            status = await run.wait()
    assert status == 0, run
    seen = [
        (e["RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in recorded_envs(tmp_path)
    ]
    assert seen == [("0", "0", "3"), ("1", "0", "5")]


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_duplicate_filters_copy_matching_tee_lines_of_every_rank(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """--duplicate-stdout-filters: tee'd lines with a filter string land in filtered_stdout.log."""
    argv = ["--standalone", "--nproc-per-node", "2", "-t", "1", "--log-dir", str(tmp_path)]
    argv += ["--duplicate-stdout-filters", "rank=1 attempt,done,,rank=0"]  # ",," is a comma
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, launcher=launcher) as run:
            status = await run.wait()
    assert status == 0, run
    [copy] = glob.glob(str(tmp_path / "*" / "attempt_0" / "filtered_stdout.log"))
    kept = [line.split(":", 1)[1].strip() for line in lines_of(copy)]
    assert kept == ["done rank=1 attempt=0 nodes=1"]


FLAT_LOGS = """
import os
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest


class FlatLogs(DefaultLogsSpecs):
    def reify(self, envs):
        root, attempt = self.root_log_dir, envs[0]["TORCHELASTIC_RESTART_COUNT"]
        errors = {r: os.path.join(root, f"rank{r}.error.json") for r in envs}
        for r, env in envs.items():  # torch's workers learn it only this way
            env["TORCHELASTIC_ERROR_FILE"] = errors[r]
        return LogsDest(
            stdouts={r: os.path.join(root, f"rank{r}-attempt{attempt}.out") for r in envs},
            stderrs={r: "" for r in envs},
            error_files=errors,
        )


class TeeFlatLogs(FlatLogs):  # stdout files also shown, a filtered copy, a variable of its own

    def reify(self, envs):
        dest = super().reify(envs)
        for env in envs.values():
            env["FLAT_LOGS"] = "reified"
        return LogsDest(
            stdouts=dest.stdouts,
            stderrs=dest.stderrs,
            tee_stdouts=dict(dest.stdouts),
            error_files=dest.error_files,
            filtered_stdout=os.path.join(self.root_log_dir, "filtered.out"),
        )
"""


def install_logs_specs_plugin(where: Path) -> dict[str, str]:
    """A distribution in ``where`` whose torchrun.logs_specs entry points 'flat' and 'flat-tee'
    are FlatLogs and TeeFlatLogs;
    returns the environment that makes it importable."""
    (where / "flat_logs.py").write_text(FLAT_LOGS)
    info = where / "flat_logs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flat-logs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.logs_specs]\nflat = flat_logs:FlatLogs\nflat-tee = flat_logs:TeeFlatLogs\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_logs_specs_plugin_decides_where_output_and_error_files_go(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """--logs-specs NAME: a torch LogsSpecs class from torchrun.logs_specs lays out the logs."""
    env = install_logs_specs_plugin(tmp_path)
    logs, out = tmp_path / "logs", tmp_path / "env"
    out.mkdir()
    argv = ["--standalone", "--nproc-per-node", "2", "--logs-specs", "flat", "--log-dir", str(logs)]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--out", str(out), launcher=launcher, env=env) as run:
            status = await run.wait()
    assert status == 0, run
    assert "done rank=" not in run.out.text
    for rank, record in enumerate(recorded_envs(out)):
        assert f"done rank={rank}" in lines_of(str(logs / f"rank{rank}-attempt0.out"))[-1]
        assert record["TORCHELASTIC_ERROR_FILE"] == str(logs / f"rank{rank}.error.json")


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_logs_specs_env_changes_reach_workers_and_its_filtered_copy_is_written(
    launcher: Sequence[str] | None, tmp_path: Path
) -> None:
    """Under --logs-specs, what reify sets in the environments reaches the workers, and the
    --duplicate-stdout-filters copy goes where its LogsDest says (both as under torchrun)."""
    env = install_logs_specs_plugin(tmp_path)
    logs, out = tmp_path / "logs", tmp_path / "env"
    out.mkdir()
    argv = ["--standalone", "--nproc-per-node", "2", "--logs-specs", "flat-tee"]
    argv += ["--log-dir", str(logs), "--duplicate-stdout-filters", "done"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--out", str(out), launcher=launcher, env=env) as run:
            status = await run.wait()
    assert status == 0, run
    assert [record["FLAT_LOGS"] for record in recorded_envs(out)] == ["reified"] * 2
    kept = sorted(line[line.index("done") :] for line in lines_of(str(logs / "filtered.out")))
    assert kept == [f"done rank={rank} attempt=0 nodes=1" for rank in range(2)]
