"""Shared pieces of the stress runs: figures printed in the terminal summary."""

from __future__ import annotations

import json
from typing import Any

import pytest

_FIGURES: dict[str, dict[str, Any]] = {}


class Figures:
    """What a stress test measured; printed at the end of the run (``make stress``)."""

    def __init__(self, name: str) -> None:
        self.values = _FIGURES.setdefault(name, {})

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = value


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.node.name)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("stress figures")
    for name, values in _FIGURES.items():
        terminalreporter.write_line(f"{name}: {json.dumps(values, default=str)}")
