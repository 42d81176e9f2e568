"""The worker-side ``record`` decorator and the agent's reading of error files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aioelastic.agent._report import WorkerFailure, format_report, read_error_file
from aioelastic.errors import record


def test_record_writes_torch_layout_and_reraises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncaught exception lands in TORCHELASTIC_ERROR_FILE in torch's layout and propagates."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        main()
    body = json.loads(path.read_text())["message"]
    assert body["message"] == "RuntimeError: boom"
    assert "raise RuntimeError" in body["extraInfo"]["py_callstack"]
    assert int(body["extraInfo"]["timestamp"]) > 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_record_wraps_coroutine_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async entry point is recorded the same way."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    async def main() -> int:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        await main()
    assert read_error_file(str(path))[0] == "KeyError: 'missing'"


def test_record_leaves_success_and_systemexit_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Returning normally or exiting is not an error: no file is written."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main(code: int) -> int:
        if code:
            raise SystemExit(code)
        return 7

    assert main(0) == 7
    with pytest.raises(SystemExit):
        main(3)
    assert not path.exists()


def test_record_without_an_agent_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside an agent (no TORCHELASTIC_ERROR_FILE) the exception just propagates."""
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)

    @record
    def main() -> None:
        raise ValueError("plain")

    with pytest.raises(ValueError, match="plain"):
        main()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"message": "short form"}', ("short form", None)),
        ("not json", "is not in torch's layout"),
        ('{"other": 1}', "is not in torch's layout"),
    ],
)
def test_error_files_in_other_shapes(tmp_path: Path, content: str, expected: object) -> None:
    """A plain message is read; a malformed file becomes a message saying so."""
    path = tmp_path / "e.json"
    path.write_text(content)
    message, callstack = read_error_file(str(path))
    if isinstance(expected, tuple):
        assert (message, callstack) == expected
    else:
        assert message is not None
        assert str(expected) in message


def test_missing_error_file_is_not_an_error(tmp_path: Path) -> None:
    """A worker that wrote no error file has no message."""
    assert read_error_file(str(tmp_path / "none.json")) == (None, None)


def test_report_puts_the_first_failure_first() -> None:
    """The report names the root cause (earliest failure), the signal and the expired scope."""
    late = WorkerFailure(1, 1, 11, 1, 200.0, "/e1", message="ValueError: x", traceback="tb line")
    first = WorkerFailure(2, 2, 12, -9, 100.0, "/e2", reaped_scope="step")
    report = format_report("train.py", [late, first], host="h")
    assert report.index("root cause (first failure): rank 2") < report.index("also failed: rank 1")
    assert "reaped by the watchdog (SIGKILL): timer 'step' expired" in report
    assert "error     : ValueError: x" in report
    assert "    tb line" in report
    assert report.splitlines()[1] == "train.py FAILED"
