"""Warm spares: the module list a worker reports, and the imports an idle spare makes."""

from __future__ import annotations

import importlib.util
import logging
import socket
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.worker import _warm
from aioelastic.worker._link import Link
from aioelastic.worker._protocol import (
    MAX_LINE,
    LinkProtocolError,
    Loaded,
    Warm,
    WorldAssigned,
    chunked,
    decode,
    encode,
)

MODULE_NAMES = st.lists(
    st.from_regex(r"[a-z_][a-z0-9_]{0,40}(\.[a-z_][a-z0-9_]{0,40}){0,4}", fullmatch=True)
)


@given(MODULE_NAMES)
def test_a_long_module_list_travels_in_lines_under_the_limit_in_order(names: list[str]) -> None:
    """chunked() splits any list into messages whose lines fit, and they decode to the list."""
    messages = chunked(Loaded, names)
    lines = [encode(message) for message in messages]
    assert all(len(line) < MAX_LINE for line in lines)
    assert [name for line in lines for name in decode(line).names] == names  # type: ignore[union-attr]


def test_a_warm_message_with_a_name_that_is_not_a_string_is_refused() -> None:
    """A Warm line whose names are not strings is not a message of the link."""
    with pytest.raises(LinkProtocolError, match="not a message of the agent-worker link"):
        decode(b'{"kind": "Warm", "names": [1]}')


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for modules the test writes; they are unloaded afterwards."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))


def test_the_report_goes_once_when_the_modules_stopped_growing() -> None:
    """Reporter sends nothing while a step still imports, then the list once, then never."""
    sent: list[list[str]] = []
    reporter = _warm.Reporter(sent.append)
    reporter.at_step()
    sys.modules["aioelastic_test_warm_fake"] = types.ModuleType("aioelastic_test_warm_fake")
    try:
        reporter.at_step()
        assert sent == []
        reporter.at_step()
        reporter.at_step()
    finally:
        del sys.modules["aioelastic_test_warm_fake"]
    assert len(sent) == 1
    assert "aioelastic_test_warm_fake" in sent[0]
    assert "__main__" not in sent[0]


def test_import_modules_imports_in_order_and_skips_what_fails(modules: Path) -> None:
    """Each name not loaded is imported; a failing import is noted and the rest go on."""
    write(modules, "warm_ok", "VALUE = 1\n")
    write(modules, "warm_broken", "raise RuntimeError('no')\n")
    done = _warm.import_modules(["__main__", "sys", "warm_broken", "warm_ok", "warm_missing"])
    assert done.imported == ["warm_ok"]
    assert done.present == 1
    assert set(done.failed) == {"warm_broken", "warm_missing"}
    assert "RuntimeError: no" in done.failed["warm_broken"]
    assert "warm_ok" in sys.modules


def test_import_modules_stops_when_asked(modules: Path) -> None:
    """stop() is asked before each import; once it says so nothing more is imported."""
    write(modules, "warm_first", "")
    write(modules, "warm_second", "")
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 1

    assert _warm.import_modules(["warm_first", "warm_second"], stop=stop).imported == ["warm_first"]
    assert "warm_second" not in sys.modules


THREADED = """
    import threading
    STOP = threading.Event()
    threading.Thread(target=STOP.wait, daemon=True).start()
"""


def test_a_spare_imports_a_module_that_starts_a_thread_and_says_so(
    modules: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A spare imports a module that starts a thread, and names it in one line."""
    write(modules, "warm_threaded", THREADED)
    caplog.set_level(logging.INFO, "aioelastic.worker")
    try:
        done = _warm.import_modules(["warm_threaded"])
        assert done.imported == ["warm_threaded"]
        assert done.threaded == ["warm_threaded"]
        assert [r.getMessage() for r in caplog.records] == [
            "warming: the import of warm_threaded started thread(s)"
        ]
    finally:
        sys.modules["warm_threaded"].STOP.set()


def linked() -> tuple[Link, socket.socket]:
    ours, theirs = socket.socketpair()
    return Link(ours), theirs


def test_an_idle_spare_imports_what_the_agent_sent(modules: Path) -> None:
    """A Warm message on the link is imported by while_idle, once."""
    write(modules, "warm_sent", "")
    link, agent = linked()
    with agent:
        agent.sendall(encode(Warm(("warm_sent",))))
        link.wait()
        assert link.warm == ["warm_sent"]
        assert _warm.while_idle(link) is True
        assert "warm_sent" in sys.modules
        assert _warm.while_idle(link) is False
    link.close()


def test_a_spare_placed_while_warming_stops_importing(modules: Path) -> None:
    """A world assigned before the imports stops them: the spare goes to its world."""
    write(modules, "warm_late", "")
    link, agent = linked()
    assigned = WorldAssigned(2, 1, 2, 1, True, 0, (1,), {"kind": "file", "path": "x"}, 10.0)
    with agent:
        agent.sendall(encode(Warm(("warm_late",))))
        link.wait()
        agent.sendall(encode(assigned))
        assert _warm.while_idle(link) is True
        assert "warm_late" not in sys.modules
        assert link.next_world() == assigned
    link.close()


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_throwaway_step_draws_no_random_number() -> None:
    """warm_up_torch leaves torch's RNG where it was (a spare without hand_over is unchanged)."""
    import torch

    before = torch.get_rng_state()
    _warm.warm_up_torch()
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_throwaway_step_imports_nothing_the_workers_did_not_load() -> None:
    """Without torch._dynamo loaded (no worker ran an optimizer) the spare's throwaway step
    skips the optimizer, whose first use imports it: a spare stays able to hear its world."""
    probe = (
        "import sys, torch; from aioelastic.worker import _warm; _warm.warm_up_torch(); "
        "print(_warm.OPTIMIZER_NEEDS in sys.modules)"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True)
    assert ran.stdout.decode().split() == ["False"]
