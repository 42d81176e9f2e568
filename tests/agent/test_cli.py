"""``aioelastic run`` flags: torchrun's names, defaults, PET_* variables and one-line errors."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

from aioelastic._launcher.launch import FlagError, config_from_args
from aioelastic.agent import Std
from aioelastic.cli import build_parser


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["run", *argv])


def test_torchrun_defaults() -> None:
    """Without flags, the defaults are torchrun's."""
    args = parse("train.py")
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_id) == (
        (1, 1),
        1,
        "static",
        "none",
    )
    assert (args.max_restarts, args.role, args.master_addr, args.shutdown_timeout) == (
        0,
        "default",
        "127.0.0.1",
        30.0,
    )
    assert args.signals_to_handle == (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )


def test_dash_and_underscore_spellings_and_script_args() -> None:
    """Both torchrun spellings work; everything after the script belongs to it."""
    args = parse(
        "--nproc_per_node=2",
        "--nnodes",
        "1:3",
        "--rdzv-conf",
        "join_timeout=5, last_call_timeout=1",
        "--local_ranks_filter",
        "0,2",
        "-r",
        "0:1,1:2",
        "--tee=3",
        "train.py",
        "--lr",
        "0.1",
    )
    assert (args.nproc_per_node, args.nnodes) == (2, (1, 3))
    assert args.rdzv_conf == {"join_timeout": "5", "last_call_timeout": "1"}
    assert args.local_ranks_filter == frozenset({0, 2})
    assert (args.redirects, args.tee) == ({0: Std.OUT, 1: Std.ERR}, Std.ALL)
    assert (args.training_script, args.training_script_args) == ("train.py", ["--lr", "0.1"])


def test_pet_environment_variables_set_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """PET_<FLAG> sets a flag's default; the command line still wins."""
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    monkeypatch.setenv("PET_STANDALONE", "1")
    args = parse("--max-restarts", "5", "train.py")
    assert (args.nproc_per_node, args.max_restarts, args.standalone) == (3, 5, True)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--shutdown-timeout", "2.5"], None, 2.5),
        (["--shutdown-timeout", "7"], None, 7.0),
        ([], "0.25", 0.25),
        (["--shutdown-timeout", "3"], "0.25", 3.0),
    ],
)
def test_shutdown_timeout_takes_fractions_from_the_flag_or_torchs_variable(
    argv: list[str], env: str | None, expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A superset of torchrun's whole seconds, on purpose (short grace periods in tests and
    quick jobs); TORCH_ELASTIC_SHUTDOWN_TIMEOUT is read the same way, the flag wins."""
    if env is not None:
        monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", env)
    assert parse(*argv, "train.py").shutdown_timeout == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "3:2"], "argument --nnodes: need 0 < MIN <= MAX, got '3:2'"),
        (["--nnodes", "x"], "expected N or MIN:MAX, got 'x'"),
        (["--nproc-per-node", "0"], "argument --nproc-per-node/--nproc_per_node: must be >= 1"),
        (["--nproc-per-node", "many"], "expected a positive integer, cpu, gpu, xpu or auto"),
        (["--rdzv-conf", "join_timeout"], "argument --rdzv-conf/--rdzv_conf: expected key=value"),
        (["--max-restarts", "-1"], "argument --max-restarts/--max_restarts: must be a finite"),
        (["--shutdown-timeout", "inf"], "must be a finite number >= 0, got 'inf'"),
        (["--redirects", "7"], "is not a stream selector"),
        (["--local-ranks-filter", "a,b"], "expected comma-separated integers"),
        (["--signals-to-handle", "SIGNOPE"], "'SIGNOPE' is not a signal name"),
        (["--master-port", "70000"], "a port is at most 65535"),
        (["--start-method", "thread"], "argument --start-method/--start_method: invalid choice"),
    ],
)
def test_bad_flags_fail_with_one_line_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad value exits with status 2 and one line that names the flag and what is expected."""
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv, "train.py")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1
    assert err.startswith("aioelastic run: error: ")
    assert message in err


def test_standalone_uses_a_private_single_node_rendezvous() -> None:
    """--standalone picks a private in-process rendezvous, a fresh run id and exactly one node."""
    config = config_from_args(parse("--standalone", "train.py"))
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("memory", f"standalone-{config.run_id}")
    assert (config.min_nodes, config.max_nodes) == (1, 1)
    assert config.run_id != "none"


def test_python_module_and_no_python_command_lines() -> None:
    """Scripts run through this Python with -u; -m runs a module; --no-python runs as is."""
    script = config_from_args(parse("train.py", "a"))
    module = config_from_args(parse("-m", "pkg.train", "a"))
    raw = config_from_args(parse("--no-python", "./run.sh", "a"))
    assert (script.entrypoint, script.args) == (sys.executable, ("-u", "train.py", "a"))
    assert module.args == ("-u", "-m", "pkg.train", "a")
    assert (raw.entrypoint, raw.args) == ("./run.sh", ("a",))


def test_static_rendezvous_gets_node_rank_and_master_endpoint() -> None:
    """The static backend is told this node's rank and rank 0's address."""
    config = config_from_args(
        parse("--node-rank", "1", "--master-addr", "10.1.1.1", "--master-port", "4000", "t.py")
    )
    assert config.rdzv_conf == {"rank": "1"}
    assert config.rdzv_endpoint == "10.1.1.1:4000"


def test_module_and_no_python_together_are_refused() -> None:
    """-m with --no-python is contradictory and says so."""
    with pytest.raises(FlagError, match="--module and --no-python cannot be combined"):
        config_from_args(parse("-m", "--no-python", "x"))


def test_nproc_cpu_counts_the_processors_this_process_may_use() -> None:
    """--nproc-per-node cpu starts one worker per processor of the affinity mask."""
    import os

    assert config_from_args(parse("--nproc-per-node", "cpu", "t.py")).nproc_per_node == len(
        os.sched_getaffinity(0)
    )


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("value", "device"), [("gpu", "CUDA"), ("xpu", "XPU")])
def test_nproc_for_a_device_that_is_missing_says_so(value: str, device: str) -> None:
    """gpu and xpu (accepted as torch accepts them) name the missing device."""
    import torch

    if getattr(torch, value.replace("gpu", "cuda")).is_available():
        pytest.skip(f"this machine has {device} devices")
    with pytest.raises(FlagError, match=f"--nproc-per-node {value}: no {device} device"):
        config_from_args(parse("--nproc-per-node", value, "t.py"))


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_unusable_log_dir_is_refused_naming_the_flag(kind: str, tmp_path: Path) -> None:
    """A --log-dir that is a file, or cannot be created, is refused before anything starts."""
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a directory")
    log_dir = blocker if kind == "file" else blocker / "logs"
    with pytest.raises(FlagError, match=r"--log-dir '.*' is not a usable directory"):
        config_from_args(parse("--log-dir", str(log_dir), "t.py"))
