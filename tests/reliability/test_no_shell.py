"""No command `aioelastic run` starts goes through a shell: arguments arrive byte for byte."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from aioelastic.cli import main

AWKWARD = [
    "two words",
    '"double quoted"',
    "it's",
    "$HOME",
    "${PATH}",
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "| cat",
    "&& exit 3",
    "*",
    "~",
    "back\\slash",
    "tab\there",
    "new\nline",
    "",
    "-m",
    "--nproc-per-node=7",
    "é ☃",
]

RECORDER = """
import json, os, sys
with open(os.environ["ARGV_OUT"] + "." + os.environ["LOCAL_RANK"], "w") as out:
    json.dump(sys.argv[1:], out)
"""


@pytest.fixture
def awkward_dir(tmp_path: Path) -> Path:
    """A working directory whose own name needs quoting in a shell."""
    path = tmp_path / "dir with $pace 'and' \"quotes\""
    path.mkdir()
    return path


def test_worker_arguments_arrive_unchanged(
    awkward_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spaces, quotes, $, backquotes, globs and newlines reach every worker unchanged."""
    script = awkward_dir / "record argv.py"
    script.write_text(RECORDER)
    monkeypatch.setenv("ARGV_OUT", str(awkward_dir / "argv"))
    monkeypatch.chdir(awkward_dir)
    status = main(["run", "--standalone", "--nproc-per-node", "2", str(script), *AWKWARD])
    assert status == 0
    for rank in (0, 1):
        assert json.loads((awkward_dir / f"argv.{rank}").read_text()) == AWKWARD
    assert not (awkward_dir / "pwned").exists()


def test_no_python_entrypoint_with_spaces_runs_directly(
    awkward_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --no-python, an executable whose path has spaces and $ runs as is, args intact."""
    program = awkward_dir / "my $prog"
    program.write_text(f"#!{sys.executable}\n{RECORDER}")
    program.chmod(0o755)
    monkeypatch.setenv("ARGV_OUT", str(awkward_dir / "argv"))
    monkeypatch.chdir(awkward_dir)
    status = main(["run", "--standalone", "--no-python", str(program), *AWKWARD])
    assert status == 0
    assert json.loads((awkward_dir / "argv.0").read_text()) == AWKWARD
    assert not (awkward_dir / "pwned").exists()
