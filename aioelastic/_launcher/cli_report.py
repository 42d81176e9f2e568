"""``aioelastic report EVENTS.jsonl... [--json]``: goodput, badput by cause and stragglers.

Give the ``--events-file`` of every node (or one file they all appended to). The accounting is
:mod:`aioelastic.events._goodput`'s; ``--json`` prints its one object (see
``docs/guides/goodput.md`` for every key).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aioelastic.events._goodput import GoodputReport

PROG = "aioelastic report"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``report`` to the ``aioelastic`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="goodput, badput by cause and stragglers of a run, from its --events-file logs",
        description=(
            "Account for a run's wall time from the event logs written by 'aioelastic run "
            "--events-file': the productive step time (goodput), start-up, each recovery, "
            "re-done steps, checkpoint saves, idle waiting for nodes and the rest; and the "
            "ranks whose median step time was slower than the fastest rank's by the factor. "
            "Steps are what workers mark with world.step(n)."
        ),
    )
    add = parser.add_argument
    add("events", nargs="+", metavar="EVENTS.jsonl", help="event logs of the run (every node's)")
    add("--json", action="store_true", help="print the report as one JSON object")
    add(
        "--straggler-window",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="seconds of a straggler window (default: the run's, else 60)",
    )
    add(
        "--straggler-factor",
        type=_positive,
        default=None,
        metavar="FACTOR",
        help="a rank slower than FACTOR times the fastest is a straggler (default: the run's, "
        "else 1/0.75)",
    )
    parser.set_defaults(handler=report_command)
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def report_command(args: argparse.Namespace) -> int:
    """Read the logs, account, print; 2 on unusable input."""
    from aioelastic.events import EventLogError, read_event_log
    from aioelastic.events._goodput import goodput_report, run_settings
    from aioelastic.events._stragglers import StragglerSettings

    try:
        events = [event for path in args.events for event in read_event_log(path)]
    except (EventLogError, OSError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if not events:
        print(f"{PROG}: error: no events in {', '.join(args.events)}", file=sys.stderr)
        return 2
    window, factor = run_settings(events)
    try:
        settings = StragglerSettings(
            window=args.straggler_window or window, factor=args.straggler_factor or factor
        )
    except ValueError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    report = goodput_report(events, stragglers=settings)
    print(json.dumps(report.to_json()) if args.json else format_report(report))
    return 0


def format_report(report: GoodputReport) -> str:
    """The human form of the report."""
    from aioelastic.events._goodput import PRODUCTIVE

    wall = report.wall_seconds
    lines = [f"wall time {wall:.2f} s, {report.steps_marked} step marks"]
    if not report.steps_marked:
        lines.append("  no step marks: call world.step(n) in the training loop (see the docs)")
    lines.append(f"  {'goodput':<11} {report.goodput:>7.1%}  {report.seconds(PRODUCTIVE):>9.2f} s")
    for cause, share in report.badput.items():
        lines.append(f"  {cause:<11} {share:>7.1%}  {report.seconds(cause):>9.2f} s")
    for recovery in report.recoveries:
        who = "" if recovery.rank is None else f" rank {recovery.rank}"
        resumed = "never resumed" if recovery.resumed_at is None else "to the next step"
        lines.append(
            f"  recovery: {recovery.cause}{who} on {recovery.node} at "
            f"+{recovery.failed_at - report.start:.2f} s, {recovery.seconds:.2f} s {resumed}"
        )
    if report.redone_steps:
        lines.append(f"  re-done steps: {report.redone_steps}")
    medians = report.rank_step_seconds()
    if medians:
        shown = ", ".join(f"{rank}: {median * 1000:.1f}" for rank, median in medians.items())
        lines.append(f"  median step time (ms) by rank: {shown}")
    stragglers = report.stragglers
    for s in stragglers:
        lines.append(
            f"  straggler: rank {s.rank} in {s.windows} window(s) of {report.window:g} s, "
            f"lowest score {s.lowest_score:.2f} (flagged under {1 / report.factor:.2f}), first "
            f"at +{s.first_named - report.start:.2f} s"
        )
    if medians and not stragglers:
        lines.append("  no straggler")
    return "\n".join(lines)
