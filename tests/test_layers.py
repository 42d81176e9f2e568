"""The package's layers point one way: a part imports only itself and the layers below it.

Every ``import`` of an ``aioelastic`` module counts (at module level, inside a function, or under
``TYPE_CHECKING``); only the lazy re-exports listed below may reach up.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import aioelastic

PACKAGE = Path(aioelastic.__file__).parent

PARTS = {
    "base": (
        "aioelastic",
        "aioelastic._clock",
        "aioelastic._concurrency",
        "aioelastic._entry_points",
        "aioelastic._loops",
        "aioelastic._run_path",
        "aioelastic._service",
        "aioelastic._subscribers",
        "aioelastic.errors",
    ),
    "kinds": ("aioelastic._kinds",),
    "events": ("aioelastic.events",),
    "timer": ("aioelastic.timer",),
    "store": ("aioelastic.store",),
    "rendezvous": ("aioelastic.rendezvous",),
    "worker": ("aioelastic.worker",),
    "agent": ("aioelastic.agent",),
    "testing": ("aioelastic.testing",),
    "metrics": ("aioelastic.metrics",),
    "launcher": ("aioelastic.__main__", "aioelastic._launcher", "aioelastic.cli"),
}
"""Each part's modules, by prefix: a module belongs to the part of its longest matching prefix."""

LAYERS = (
    ("base",),
    ("kinds",),
    ("timer", "store"),
    ("events",),
    ("metrics",),
    ("rendezvous", "worker"),
    ("agent",),
    ("testing",),
    ("launcher",),
)
"""Lowest first. Parts of one layer do not import each other."""

LAZY_RE_EXPORTS = {
    ("aioelastic.events", "aioelastic._launcher.observe"),
    ("aioelastic.events", "aioelastic._launcher.progress"),
}
"""(module, imported module) pairs allowed to reach up: imported on first attribute access."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    matches = [
        (len(prefix), part)
        for part, prefixes in PARTS.items()
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} belongs to no part: add it to PARTS"
    return max(matches)[1]


def layer_of(part: str) -> int:
    return next(index for index, parts in enumerate(LAYERS) if part in parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The aioelastic modules ``path`` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def test_every_import_points_down_or_stays_in_its_part() -> None:
    """No module imports a part of its own layer or of a layer above it."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    known = set(paths)
    upward = []
    for module, path in sorted(paths.items()):
        part = part_of(module)
        for target in sorted(imported_modules(path, known)):
            other = part_of(target)
            if other == part or (module, target) in LAZY_RE_EXPORTS:
                continue
            if layer_of(other) >= layer_of(part):
                upward.append(f"{module} ({part}) imports {target} ({other})")
    assert upward == []


def test_every_part_is_in_one_layer() -> None:
    """The layer table names each part exactly once."""
    named = [part for layer in LAYERS for part in layer]
    assert sorted(named) == sorted(PARTS)


def parts_loaded_by(module: str) -> set[str]:
    """The parts a fresh interpreter holds after ``import module``."""
    code = (
        f"import sys, {module}\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('aioelastic')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    return {part_of(name) for name in loaded}


def test_importing_the_event_stream_loads_no_part_it_observes() -> None:
    """``import aioelastic.events`` loads the events package and the base modules only."""
    assert parts_loaded_by("aioelastic.events") == {"base", "events"}


def test_importing_the_metrics_loads_no_part_above_the_stream() -> None:
    """``import aioelastic.metrics`` reads the agent's and rendezvous' event types, not them."""
    assert parts_loaded_by("aioelastic.metrics") == {"base", "kinds", "timer", "events", "metrics"}


def test_importing_the_agent_package_loads_only_its_face() -> None:
    """``import aioelastic.agent`` loads what it names on first use, not the agent's machinery."""
    assert parts_loaded_by("aioelastic.agent") == {"base", "agent"}


def test_no_module_is_longer_than_a_reader_holds() -> None:
    """Every module of the package holds at most 700 lines (split by idea past that)."""
    package = Path(aioelastic.__file__).parent
    lengths = {
        p.relative_to(package): len(p.read_text().splitlines()) for p in package.rglob("*.py")
    }
    assert {path: n for path, n in lengths.items() if n > 700} == {}
