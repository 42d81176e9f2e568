"""The third source of the learned fork template: the imports the worker site records.

A plain script says nothing of what it imports lazily (``torch._dynamo`` in a first DDP step is
pure Python: not in the maps); the worker site appends each import's name to the file the agent
names (``aioelastic/_imports_file.py``), and the agent learns from it (``_learned.py``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic._imports_file import IMPORTS_FILE_ENV
from aioelastic.agent._learned import ImportsFile, complete_lines, watch
from aioelastic.agent._site import without_worker_site, worker_site_env
from aioelastic.agent._template import Template, _first_bytes
from aioelastic.agent._template_command import python_command
from tests.agent.conftest import BOUND, launched
from tests.agent.test_preload import probe_command

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """These only drive subprocesses and a file."""
    return request.param


def test_the_site_records_a_plain_workers_imports_and_hides_the_variable(tmp_path: Path) -> None:
    """Imports are recorded in order (a failed one too, a forked child's too); a mere look-up
    is not; the script does not see the variable."""
    imports = tmp_path / "imports"
    env = {**os.environ, **worker_site_env(os.environ), IMPORTS_FILE_ENV: str(imports)}
    done = subprocess.run(
        [sys.executable, str(WORKERS / "imports_probe.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["variable None"]
    names = imports.read_text().splitlines()
    wanted = ["lazy_marker", "no_such_module_q", "colorsys"]
    assert [name for name in names if name in wanted] == wanted
    assert "preload_marker" not in names


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_dynamo_imported_through_torchs_getattr_is_recorded(tmp_path: Path) -> None:
    """What DDP's first call does (``torch._dynamo`` through ``torch.__getattr__``) is an import
    the site records, after torch and before the modules it loads."""
    imports = tmp_path / "imports"
    env = {**os.environ, **worker_site_env(os.environ), IMPORTS_FILE_ENV: str(imports)}
    code = "import torch; torch._dynamo"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=BOUND, check=False
    )
    assert done.returncode == 0, done.stderr
    names = imports.read_text().splitlines()
    assert (
        names.index("torch")
        < names.index("torch._dynamo")
        < names.index("torch._dynamo.eval_frame")
    )


def test_only_local_rank_0_with_the_worker_site_is_asked_to_record() -> None:
    """The node's workers run one script: local rank 0 records, when the site is on its path
    (nothing else would read the variable) and the template learns."""
    command = python_command(probe_command())
    site = worker_site_env({})
    learning = Template(command, (), learn=True, env={}, emit=print, imports_file="/tmp/x")
    assert learning.recording_env(0, site) == {IMPORTS_FILE_ENV: "/tmp/x"}
    assert learning.recording_env(1, site) == {}
    assert learning.recording_env(0, {"PYTHONPATH": "/a"}) == {}
    preloading = Template(command, ("json",), env={}, emit=print, imports_file="/tmp/x")
    assert preloading.recording_env(0, site) == {}


def test_a_forked_worker_gets_no_imports_file() -> None:
    """The template's forks record nothing: the variable goes with the site's path."""
    env = {"HOME": "/root", IMPORTS_FILE_ENV: "/tmp/x", **worker_site_env({})}
    assert without_worker_site(env) == {"HOME": "/root"}


@given(st.lists(st.binary(max_size=40), max_size=8))
def test_names_read_in_pieces_are_the_names_read_at_once(pieces: list[bytes]) -> None:
    """However the writes fall into reads, only whole lines are taken, each once."""
    whole, used = complete_lines(b"".join(pieces))
    taken: list[str] = []
    buffer = b""
    for piece in pieces:
        buffer += piece
        names, end = complete_lines(buffer)
        taken += names
        buffer = buffer[end:]
    assert taken == whole
    assert buffer == b"".join(pieces)[used:]
    assert all(part.isidentifier() for name in whole for part in name.split("."))


def test_the_imports_file_is_read_from_where_it_stopped(tmp_path: Path) -> None:
    """Each read gives what was appended since; a line still being written waits."""
    path = tmp_path / "imports"
    imports = ImportsFile(str(path))
    assert imports.read_new() == []  # no worker recorded anything yet
    path.write_bytes(b"torch\ntorch._C\nnot a name\ntorch._dyn")
    assert imports.read_new() == ["torch", "torch._C"]
    with path.open("ab") as file:
        file.write(b"amo\n")
    assert imports.read_new() == ["torch._dynamo"]
    assert imports.read_new() == []


@pytest.mark.anyio
async def test_watch_learns_the_recorded_imports_once_they_stopped_growing(tmp_path: Path) -> None:
    """The file's names reach ``learn`` in import order, once a look found nothing new."""
    path = tmp_path / "imports"
    path.write_text("torch\ntorch._dynamo\nlazy_marker\ntorch\n")
    learned: list[list[str]] = []
    done = anyio.Event()

    def learn(names: Any) -> None:
        learned.append(list(names))
        done.set()

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: watch(list, list, learn, ImportsFile(str(path)), first_look=0.001)
            )
            await done.wait()
            tg.cancel_scope.cancel()
    assert learned == [["torch", "torch._dynamo", "lazy_marker"]]


@pytest.mark.anyio
async def test_a_restart_forks_from_a_template_holding_a_module_imported_lazily() -> None:
    """aioelastic run: the first worker imports a pure-Python module after it started; the
    agent learns it from the recorded imports (the maps cannot show it), and the worker that
    replaces the killed one is a fork of the template and has the module from its start."""
    argv = ["--standalone", "--nproc-per-node=1", "--max-restarts=1"]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv, str(WORKERS / "learned_lazy.py")) as run:
            await run.err.wait_for("the next workers fork from it")
            first = re.search(r"restart 0 pid (\d+) ppid \d+ had False", run.out.text)
            assert first is not None, run
            os.kill(int(first[1]), signal.SIGKILL)
            status = await run.wait()
    assert status == 0, run
    learned = re.search(r"template \(pid (\d+)\) holds \d+ module\(s\)", run.err.text)
    assert learned is not None, run
    assert re.search(rf"restart 1 pid \d+ ppid {learned[1]} had True", run.out.text), run


@given(
    st.lists(st.text(alphabet="abc._", min_size=1, max_size=30), max_size=60), st.integers(1, 200)
)
def test_learned_names_go_to_the_template_in_bounded_requests(names: list[str], limit: int) -> None:
    """Each request holds the next names, one at least, within the bound unless one alone is
    longer; together they are every name, in order."""
    batches, rest = [], names
    while rest:
        batch = _first_bytes(rest, limit)
        assert batch == rest[: len(batch)]
        assert len(batch) == 1 or sum(len(name) + 4 for name in batch) <= limit
        batches.append(batch)
        rest = rest[len(batch) :]
    assert [name for batch in batches for name in batch] == names
