"""`aioelastic run` given wrong types or out-of-range values: one line naming the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioelastic.cli import main


def bad(*argv: str, name: str | None = None, **marks: pytest.MarkDecorator) -> object:
    """A case: the flags, and the name the error must mention (default: the first flag)."""
    expected = name or argv[0].split("=")[0]
    return pytest.param(list(argv), expected, id=" ".join(argv), marks=list(marks.values()))


def conf(setting: str, **marks: pytest.MarkDecorator) -> object:
    """A case for one --rdzv-conf key=value on the in-process (standalone) rendezvous."""
    key = setting.split("=")[0]
    return bad("--standalone", "--rdzv-conf", setting, name=key, **marks)


FLAGS = [
    bad("--nnodes", "0"),
    bad("--nnodes", "3:2"),
    bad("--nnodes", "x"),
    bad("--nnodes", "1:"),
    bad("--nproc-per-node", "0"),
    bad("--nproc-per-node", "-2"),
    bad("--nproc-per-node", "abc"),
    bad("--nproc-per-node", "1.5"),
    bad("--max-restarts", "-1"),
    bad("--max-restarts", "x"),
    bad("--max-restarts", "1.5"),
    bad("--monitor-interval", "-1"),
    bad("--monitor-interval", "nan"),
    bad("--monitor-interval", "x"),
    bad("--start-method", "bogus"),
    bad("--redirects", "9"),
    bad("--redirects", "0:9"),
    bad("--tee", "x"),
    bad("--tee", "4"),
    bad("--local-ranks-filter", "a"),
    bad("--node-rank", "-1"),
    bad("--node-rank", "x"),
    bad("--master-port", "70000"),
    bad("--master-port", "-1"),
    bad("--master-port", "x"),
    bad("--signals-to-handle", "SIGNOPE"),
    bad("--signals-to-handle", "9999"),
    bad("--shutdown-timeout", "-1"),
    bad("--shutdown-timeout", "nan"),
    bad("--shutdown-timeout", "x"),
    bad("--standalone", "--shutdown-timeout", "inf", name="--shutdown-timeout"),
    bad("--rdzv-backend", "nope"),
    bad("--standalone", "--role=", name="role"),
    bad("--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:notaport", name="endpoint"),
    bad("--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:99999", name="endpoint"),
    bad("--module", "--no-python", name="--no-python"),
]
CONF = [
    conf("novalue"),
    bad("--rdzv-conf", "=1"),
    conf("bogus=1"),
    conf("join_timeout=abc"),
    conf("join_timeout=-1"),
    conf("join_timeout=0"),
    conf("join_timeout=nan"),
    conf("join_timeout=1e400"),
    conf("timeout=x"),
    bad("--standalone", "--rdzv-conf", "timeout=5,join_timeout=6", name="join_timeout"),
    conf("last_call_timeout=abc"),
    conf("last_call_timeout=-1"),
    conf("last_call_timeout=inf"),
    conf("close_timeout=abc"),
    conf("close_timeout=-1"),
    conf("heartbeat_timeout=0"),
    conf("heartbeat_timeout=abc"),
    conf("keep_alive_interval=inf"),
    conf("keep_alive_interval=-1"),
    conf("keep_alive_max_attempt=abc"),
    conf("keep_alive_max_attempt=-3"),
    conf("keep_alive_max_attempt=1.5"),
    conf("read_timeout=abc"),
    conf("read_timeout=-5"),
    conf("store=x"),
    conf("clock=x"),
]
LOG_DIR = ["file", "missing-parent"]


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "worker.py"
    path.write_text("print('the worker ran')\n")
    return str(path)


def run(argv: list[str], script: str, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """Run `aioelastic run ARGV SCRIPT` in-process; return its exit code and its stderr."""
    try:
        code: object = main(["run", *argv, script])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def check_one_line_error(code: object, output: str, name: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2, output
    assert len(lines) == 1, output
    assert "Traceback" not in output
    assert name.lstrip("-") in lines[0], lines[0]


@pytest.mark.parametrize(("argv", "name"), FLAGS + CONF)
def test_bad_value_is_one_line_naming_it(
    argv: list[str], name: str, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong type or out-of-range value exits 2 with one line that names the flag or key."""
    code, output = run(argv, script, capsys)
    check_one_line_error(code, output, name)


@pytest.mark.parametrize("kind", LOG_DIR)
def test_unusable_log_dir_is_one_line(
    kind: str, script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --log-dir that is a file, or cannot be created, is one line naming --log-dir."""
    log_dir = script if kind == "file" else str(tmp_path / "no" / "such" / "parent" / "x")
    (tmp_path / "no").write_text("a file where a directory should be")
    try:
        code, output = run(
            ["--standalone", "--redirects", "3", "--log-dir", log_dir], script, capsys
        )
    except BaseException as exc:  # what escapes is what a user would see as a traceback
        code, output = "raised", f"Traceback: {exc!r}"
    check_one_line_error(code, output, "--log-dir")


@pytest.mark.parametrize("setting", ["is_host=maybe", "read_timeout=-1", "join_timeout=x"])
def test_bad_c10d_option_is_one_line(
    setting: str, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the c10d backend too, a bad --rdzv-conf value is one line naming the key."""
    argv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-conf", setting]
    code, output = run(argv, script, capsys)
    check_one_line_error(code, output, setting.split("=")[0])
