"""The learned fork template (``--fork-template auto``): what workers load, learned while they
run, imported by a template that the later starts fork from.

The rules are pure (``_learned.py``); the template and the agent are real processes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent._events import AgentEvent, TemplateLearned
from aioelastic.agent._learned import packages_in_maps, worth_a_template
from aioelastic.agent._template import Template
from aioelastic.agent._template_command import python_command
from tests.agent.conftest import BOUND, launched, wait_gone
from tests.agent.test_preload import probe_command, spawn_probe

WORKERS = Path(__file__).parent / "workers"
EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """These only drive subprocesses; the launcher itself runs on uvloop when installed."""
    return request.param


SITE = "/opt/venv/lib/python3.11/site-packages"
MAPS = f"""\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 131 /usr/bin/python3.11
7f0000000000-7f0000001000 r-xp 00000000 08:01 132 {SITE}/torch/lib/libtorch_cpu.so
7f0000001000-7f0000002000 r-xp 00000000 08:01 133 {SITE}/numpy.libs/libopenblas.so
7f0000002000-7f0000003000 r-xp 00000000 08:01 134 {SITE}/numpy/core/_multiarray.so
7f0000003000-7f0000004000 r-xp 00000000 08:01 135 {SITE}/torch/_C.cpython-311.so
7f0000004000-7f0000005000 r-xp 00000000 08:01 136 {SITE}/_cffi_backend.cpython-311.so
7f0000005000-7f0000006000 r-xp 00000000 08:01 137 /usr/lib/python3/dist-packages/yaml/_y.so
7f0000006000-7f0000007000 r-xp 00000000 08:01 138 {SITE}/aioelastic/_x.so
7f0000007000-7f0000008000 r-xp 00000000 08:01 139 /usr/lib/python3.11/lib-dynload/_ssl.so
7f0000008000-7f0000009000 r-xp 00000000 08:01 140 {SITE}/gone/_g.so (deleted)
7f0000009000-7f000000a000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]
"""


def test_the_packages_a_process_mapped_are_read_from_its_maps() -> None:
    """Installed packages with compiled code, once each and in order; not the interpreter,
    the standard library's extensions, a ``.libs`` folder or our own package."""
    assert packages_in_maps(MAPS) == ["torch", "numpy", "_cffi_backend", "yaml", "gone"]


@given(st.lists(st.text(alphabet=" /.-_abcxyz0123456789[]()", max_size=60), max_size=20))
def test_any_maps_text_gives_importable_names_once(lines: list[str]) -> None:
    """Whatever the lines, each name found is an identifier, and none twice."""
    found = packages_in_maps("\n".join(lines))
    assert all(name.isidentifier() for name in found)
    assert len(found) == len(set(found))


def test_a_template_is_worth_it_only_for_more_than_the_standard_library() -> None:
    """The standard library and aioelastic import in milliseconds: no template for them."""
    assert not worth_a_template(["json", "os.path", "aioelastic.worker", "__main__", "_io"])
    assert worth_a_template(["json", "torch.nn"])
    assert worth_a_template(["my_model"])


class Events:
    """The template's events, as they come; tests wait for a kind of them."""

    def __init__(self) -> None:
        self.seen: list[AgentEvent] = []
        self._changed = anyio.Event()

    def __call__(self, event: AgentEvent) -> None:
        self.seen.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    def of(self, kind: type[AgentEvent]) -> list[AgentEvent]:
        return [event for event in self.seen if isinstance(event, kind)]

    async def wait_for(self, kind: type[AgentEvent], count: int = 1) -> None:
        while len(self.of(kind)) < count:
            await self._changed.wait()


@pytest.mark.anyio
async def test_a_learning_template_starts_when_worth_it_and_imports_leniently() -> None:
    """Learned names start the template once one is worth it; a failing import is skipped, one
    that starts a thread left out; the template holds the rest, and so does the next fork."""
    events = Events()
    command = python_command(probe_command())
    async with Template(command, (), learn=True, env=os.environ, emit=events) as template:
        with anyio.fail_after(BOUND):
            await template.wait_ready()  # nothing to preload: nothing to wait for
            template.learn(["json", "fractions"])
            template.learn(["preload_marker", "no_such_module_q", "preload_thread"])
            await events.wait_for(TemplateLearned)
            worker, report = await spawn_probe(template, 1)
    (learned,) = events.of(TemplateLearned)
    assert isinstance(learned, TemplateLearned)
    assert learned.modules == ("json", "fractions", "preload_marker")
    assert learned.left_out == ("preload_thread",)
    assert worker.forked
    assert report["preloaded"] == ["fractions", "preload_marker"]
    assert template.statistics().starts == 1
    assert template.learned == ("json", "fractions", "preload_marker")


@pytest.mark.anyio
async def test_a_replacement_template_imports_what_was_learned_again() -> None:
    """A learning template that dies is replaced; the new one imports the learned names too."""
    events = Events()
    command = python_command(probe_command())
    async with Template(command, (), learn=True, env=os.environ, emit=events) as template:
        with anyio.fail_after(BOUND):
            template.learn(["preload_marker"])
            await events.wait_for(TemplateLearned)
            first = template.pid
            assert first is not None
            os.kill(first, 9)
            await wait_gone(first)
            await events.wait_for(TemplateLearned, 2)
            second = template.pid
            worker, report = await spawn_probe(template, 1)
    pids = [e.pid for e in events.of(TemplateLearned) if isinstance(e, TemplateLearned)]
    assert pids == [first, second]
    assert worker.forked
    assert report["ppid"] == second
    assert report["preloaded"] == ["preload_marker"]


@pytest.mark.anyio
@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="needs uvloop")
async def test_a_restart_forks_from_the_template_that_learned_the_workers_packages(
    tmp_path: Path,
) -> None:
    """aioelastic run: the first worker starts plainly; the agent learns the package it
    loaded from its maps, a template imports it, and the restarted worker is its fork."""
    go = tmp_path / "go"
    os.mkfifo(go)
    argv = ["--standalone", "--nproc-per-node=1", "--max-restarts=1"]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv, str(WORKERS / "learned_restart.py"), str(go)) as run:
            await run.err.wait_for("the next workers fork from it")
            go.write_text("fail now\n")
            status = await run.wait()
    assert status == 0, run
    imported = re.search(r"template \(pid (\d+)\) holds \d+ module\(s\) [^(]*\((\w+)", run.err.text)
    assert imported is not None, run
    (first_parent, second_parent) = [
        int(m) for m in re.findall(r"restart \d pid \d+ ppid (\d+)", run.out.text)
    ]
    assert (second_parent, imported[2]) == (int(imported[1]), "uvloop")
    assert first_parent != second_parent
    paths = re.findall(r"restart \d pid \d+ ppid \d+ path (.*)", run.out.text)
    (plain, forked) = paths
    assert forked == plain  # the exit hook's directory is off the fork's path as off the plain one


@pytest.mark.anyio
@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="needs uvloop")
async def test_fork_template_off_starts_every_worker_plainly(tmp_path: Path) -> None:
    """--fork-template off: no template, so the restarted worker is the agent's child too."""
    go = tmp_path / "go"
    os.mkfifo(go)
    argv = ["--standalone", "--nproc-per-node=1", "--max-restarts=1", "--fork-template=off"]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv, str(WORKERS / "learned_restart.py"), str(go)) as run:
            await run.out.wait_for("restart 0 ")
            go.write_text("fail now\n")
            status = await run.wait()
    assert status == 0, run
    parents = {int(m) for m in re.findall(r"restart \d pid \d+ ppid (\d+)", run.out.text)}
    assert len(parents) == 1, run
    assert "fork template" not in run.err.text


@pytest.mark.anyio
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None and importlib.util.find_spec("uvloop") is None,
    reason="needs an installed package with compiled code (torch or uvloop)",
)
async def test_the_warm_restart_example_restarts_workers_with_torch_already_imported() -> None:
    """examples/warm_restart.py: the first workers import the package; the restarted ones,
    forks of the one template, find it imported."""
    with anyio.fail_after(BOUND * 2):
        done = await anyio.run_process([sys.executable, str(EXAMPLES / "warm_restart.py")])
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("restart ")]
    firsts = sorted(line for line in lines if line.startswith("restart 0"))
    seconds = sorted(line for line in lines if line.startswith("restart 1"))
    assert [line.split()[6] for line in firsts] == ["imported=False"] * 2
    assert [line.split()[6] for line in seconds] == ["imported=True"] * 2
    assert len({line.rsplit("parent=", 1)[1] for line in seconds}) == 1
