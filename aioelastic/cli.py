"""The ``aioelastic`` command: a thin dispatcher over the subcommands each part provides.

A subcommand lives next to the code it drives, in a module exposing ``add_parser(subparsers)``;
the parser it adds sets ``handler``, a callable taking the parsed namespace and returning the
exit status. Modules are listed here by name so ``--help`` stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

__all__ = ["SUBCOMMAND_MODULES", "build_parser", "main"]

SUBCOMMAND_MODULES = (
    "aioelastic.store._cli",
    "aioelastic._launcher.cli_run",
    "aioelastic._launcher.cli_status",
    "aioelastic._launcher.cli_timeline",
    "aioelastic._launcher.cli_report",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every available subcommand attached."""
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="aioelastic",
        description="Asyncio-native coordination for elastic distributed jobs.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(subparsers)
    return parser, subparsers


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return its exit status."""
    parser, subparsers = _build()
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if unknown:  # a subcommand's flag: its own usage, not the top-level one
        chosen = subparsers.choices[args.command]
        chosen.print_usage(sys.stderr)
        chosen.exit(2, f"{chosen.prog}: error: unrecognized arguments: {' '.join(unknown)}\n")
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)
