"""The torchrun migration page names every flag and worker variable, ours and torchrun's."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path

import pytest

from aioelastic.cli import build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


def long_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The first ``--long`` spelling of each option of ``parser`` (help left out)."""
    return [
        next(name for name in action.option_strings if name.startswith("--"))
        for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


def missing(names: list[str]) -> list[str]:
    """The names the page does not show as code (`` `--flag` ``, `` `-m/--flag` ``, `` `VAR` ``)."""
    text = PAGE.read_text()
    return [name for name in names if not re.search(rf"[`/]{re.escape(name)}(?![\w-])", text)]


def test_every_flag_of_run_is_on_the_page() -> None:
    """Each flag of ``aioelastic run`` appears on the page (ours-only ones included)."""
    (commands,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert missing(long_flags(commands.choices["run"])) == []


@pytest.mark.torch
@needs_torch
def test_every_torchrun_flag_is_on_the_page() -> None:
    """Each flag of torch's installed torchrun appears on the page."""
    from torch.distributed.run import get_args_parser

    assert missing(long_flags(get_args_parser())) == []


@pytest.mark.torch
@needs_torch
def test_every_variable_torchrun_gives_workers_is_on_the_page() -> None:
    """Each key of the environment torch's LocalElasticAgent builds for a worker appears."""
    import torch.distributed.elastic.agent.server.local_elastic_agent as agent

    tree = ast.parse(Path(agent.__file__).read_text())
    (worker_env,) = (
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "worker_env" for t in node.targets)
        and isinstance(node.value, ast.Dict)
    )
    names = [key.value for key in worker_env.keys if isinstance(key, ast.Constant)]
    assert len(names) > 10
    assert missing([*names, "LOCAL_RANK", "OMP_NUM_THREADS"]) == []
