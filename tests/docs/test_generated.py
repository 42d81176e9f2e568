"""The generated reference pages: every subcommand option and every event type, from the code."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest

from aioelastic.cli import build_parser

HOOKS = Path(__file__).resolve().parents[2] / "docs" / "_gen" / "hooks.py"
PUBLIC = ("timer", "store", "rendezvous", "agent", "worker", "events", "metrics", "testing")


def load_hooks() -> Any:
    spec = importlib.util.spec_from_file_location("docs_hooks", HOOKS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def test_the_cli_reference_lists_every_option_of_every_subcommand() -> None:
    """Each subcommand has a section, and each of its options (but --help) a row."""
    text = hooks.cli_reference()
    (commands,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    absent = [
        f"{name} {option}"
        for name, parser in commands.choices.items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
        if f"## `aioelastic {name}`" not in text or f"`{option}`" not in text
    ]
    assert absent == []


def test_the_cli_reference_ignores_pet_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page shows the built-in defaults, not those of the machine that builds it."""
    plain = hooks.cli_reference()
    monkeypatch.setenv("PET_NPROC_PER_NODE", "7")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9")
    assert hooks.cli_reference() == plain


def test_every_public_event_union_is_on_the_events_page() -> None:
    """Each ``...Event`` union a public package exports is listed, with every member."""
    unions = {
        (f"aioelastic.{package}", name)
        for package in PUBLIC
        for name in importlib.import_module(f"aioelastic.{package}").__all__
        if name.endswith("Event")
        and isinstance(
            getattr(importlib.import_module(f"aioelastic.{package}"), name), types.UnionType
        )
    }
    listed = {(module, union) for module, union, _ in hooks.EVENT_UNIONS}
    assert unions == listed
    text = hooks.events_reference()
    members = [
        cls.__name__
        for module, union in listed
        for cls in getattr(importlib.import_module(module), union).__args__
    ]
    assert [name for name in members if f"### {name}\n" not in text] == []
