"""mkdocs hooks: the pages that are made from the code and from files outside docs/.

A page asks for generated text with a marker line ``<!-- generated: NAME -->``; the hook
replaces it before the page is rendered, so the CLI reference comes from the argparse parser,
the events reference from the event unions, the metrics reference from a live
``PrometheusMetrics`` registry, and the benchmark pages from BENCHMARKS.md (which ``make
bench`` writes) with bench/'s charts. Nothing here can drift from what it describes.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import os
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the generators import without mkdocs (tests/docs use them)
    from mkdocs.structure.files import Files

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: (?P<name>[a-z-]+) -->$", re.MULTILINE)
CHARTS = ("bench/ratios.png", "bench/scale.png")
"""bench/'s charts, published at the same paths under the site's root."""


# -- the command line ------------------------------------------------------------------------


@contextmanager
def _clean_environment() -> Iterator[None]:
    """Build parsers without the ``PET_*`` variables that change their defaults."""
    saved = {
        name: os.environ.pop(name)
        for name in list(os.environ)
        if name.startswith("PET_") or name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
    }
    try:
        yield
    finally:
        os.environ.update(saved)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or isinstance(action.default, bool):
        return ""
    return f"`{action.default}`"


def _subcommand(name: str, parser: argparse.ArgumentParser) -> list[str]:
    pets = getattr(parser.get_default("pet_names"), "__contains__", None)
    lines = [f"## `aioelastic {name}`", "", parser.description or "", ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    header = "| option | default | help |"
    if pets is not None:
        header = "| option | default | variable | help |"
    lines += [header, "|---|---|---|---|" if pets else "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            spellings = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            spellings = f"`{action.metavar or action.dest}`"
        if action.choices and not isinstance(action.choices, dict):
            spellings += " (" + ", ".join(f"`{c}`" for c in action.choices) + ")"
        row = [spellings, _default(action)]
        if pets is not None:
            variable = f"PET_{action.dest.upper()}"
            row.append(f"`{variable}`" if action.option_strings and pets(variable) else "")
        row.append(_cell(parser._get_formatter()._expand_help(action) if action.help else ""))
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def cli_reference() -> str:
    """Every subcommand of ``aioelastic``: usage and each option, read from the parser."""
    from aioelastic.cli import build_parser

    with _clean_environment():
        parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = []
    for name, sub in commands.choices.items():
        lines += _subcommand(name, sub)
    return "\n".join(lines)


# -- events ----------------------------------------------------------------------------------

EVENT_UNIONS = (
    ("aioelastic.timer", "TimerEvent", "timer"),
    ("aioelastic.rendezvous", "RendezvousEvent", "rendezvous"),
    ("aioelastic.agent", "AgentEvent", "agent"),
    ("aioelastic.store", "EtcdStoreEvent", "store"),
)
"""The public unions of each component's events, and the source name ``observe`` gives it."""


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Za-z_])", "", text)


def _event_section(cls: type, source: str) -> list[str]:
    from aioelastic.events import WarningEvent

    doc = inspect.cleandoc(cls.__doc__ or "").replace(":class:", "").replace(":meth:", "")
    doc = re.sub(r"`~?(?:[\w]+\.)*(\w+)`", r"`\1`", doc).replace("``", "`")
    level = "WARNING" if issubclass(cls, WarningEvent) else "INFO"
    lines = [f"### {cls.__name__}", "", f"*source* `{source}` · *logged at* {level}", "", doc, ""]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if fields:
        hints = typing.get_type_hints(cls)
        lines += ["| field | type |", "|---|---|"]
        for field in fields:
            annotation = _cell(_type_name(hints.get(field.name, field.type)))
            lines.append(f"| `{field.name}` | `{annotation}` |")
        lines.append("")
    return lines


def events_reference() -> str:
    """Every event type, grouped by component, with its fields."""
    lines: list[str] = []
    for module_name, union, source in EVENT_UNIONS:
        module = importlib.import_module(module_name)
        members = typing.get_args(getattr(module, union))
        lines += [f"## {module_name}", "", f"`{module_name}.{union}`: {len(members)} types.", ""]
        for cls in members:
            lines += _event_section(cls, source)
    from aioelastic.events import RendezvousWaiting

    lines += ["## aioelastic.events", ""]
    lines += _event_section(RendezvousWaiting, "rendezvous")
    return "\n".join(lines)


# -- metrics ---------------------------------------------------------------------------------


def metrics_reference() -> str:
    """Every Prometheus family ``PrometheusMetrics`` registers, as a scrape names it."""
    from aioelastic.metrics import PrometheusMetrics

    metrics = PrometheusMetrics()
    lines = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for family in metrics.registry.collect():
        suffix = "_total" if family.type == "counter" else ""
        labels = sorted(
            {k for s in family.samples for k in s.labels if k not in ("le",)}
            | set(_declared_labels(metrics, family.name))
        )
        cells = [
            f"`{family.name}{suffix}`",
            family.type,
            ", ".join(f"`{label}`" for label in labels),
            _cell(family.documentation),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _declared_labels(metrics: Any, name: str) -> tuple[str, ...]:
    for value in vars(metrics).values():
        if getattr(value, "_name", None) == name:
            return tuple(getattr(value, "_labelnames", ()))
    return ()


# -- files outside docs/ ---------------------------------------------------------------------


def _without_title(text: str) -> str:
    """A markdown file less its first ``# `` heading (the page has its own)."""
    return re.sub(r"\A# .*\n", "", text, count=1)


def _sections(text: str) -> list[tuple[str, str]]:
    """The ``## `` sections of a markdown file: (title, text) in order, the preamble first."""
    parts = re.split(r"(?m)^(?=## )", text)
    return [
        (part.split("\n", 1)[0][3:].strip() if part.startswith("## ") else "", part)
        for part in parts
    ]


def _benchmarks(scale: bool, page_dir: str) -> str:
    text = _without_title((ROOT / "BENCHMARKS.md").read_text())
    kept = [part for title, part in _sections(text) if (title == "scale") == scale]
    depth = len(Path(page_dir).parts)
    return "".join(kept).replace("](bench/", "](" + "../" * depth + "bench/")


def _file(name: str) -> Callable[[str], str]:
    return lambda page_dir: _without_title((ROOT / name).read_text())


GENERATORS: dict[str, Callable[[str], str]] = {
    "cli": lambda page_dir: cli_reference(),
    "events": lambda page_dir: events_reference(),
    "metrics": lambda page_dir: metrics_reference(),
    "benchmarks": lambda page_dir: _benchmarks(False, page_dir),
    "scale": lambda page_dir: _benchmarks(True, page_dir),
    "reliability": _file("RELIABILITY.md"),
    "changelog": _file("CHANGELOG.md"),
}


def on_files(files: Files, config: Any) -> Files:
    """Publish bench/'s charts beside the pages that show them."""
    from mkdocs.structure.files import File

    for chart in CHARTS:
        files.append(File.generated(config, chart, abs_src_path=str(ROOT / chart)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with what NAME makes."""
    page_dir = str(Path(page.file.src_uri).parent)

    def generate(found: re.Match[str]) -> str:
        name = found["name"]
        if name not in GENERATORS:
            raise ValueError(
                f"{page.file.src_uri}: no generator {name!r} ({', '.join(GENERATORS)})"
            )
        return GENERATORS[name]("" if page_dir == "." else page_dir)

    return MARKER.sub(generate, markdown)
