"""``aioelastic timeline EVENTS.jsonl... -o timeline.png``: a picture of a run from its event logs.

Give the ``--events-file`` of every node (or one file they all appended to); the lanes are
one per node and one per worker rank. Needs matplotlib (``pip install 'aioelastic[timeline]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

PROG = "aioelastic timeline"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``timeline`` to the ``aioelastic`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "timeline",
        help="draw a run's timeline (PNG) from its --events-file logs",
        description=(
            "Draw one lane per node (rendezvous, restarts, membership changes) and one per "
            "worker rank (lifetimes, failures, watchdog reaps) from event logs written by "
            "'aioelastic run --events-file'."
        ),
    )
    parser.add_argument("events", nargs="+", metavar="EVENTS.jsonl", help="event logs to draw")
    parser.add_argument("-o", "--output", default="timeline.png", help="the PNG to write")
    parser.add_argument("--title", default=None, help="the picture's title")
    parser.set_defaults(handler=timeline_command)
    return parser


def timeline_command(args: argparse.Namespace) -> int:
    """Read the logs, draw, say where the picture went; 2 on unusable input."""
    from aioelastic.events import EventLogError, read_event_log
    from aioelastic.events._timeline import build_timeline, render_timeline

    if importlib.util.find_spec("matplotlib") is None:
        print(f"{PROG}: needs matplotlib: pip install 'aioelastic[timeline]'", file=sys.stderr)
        return 2
    try:
        events = [event for path in args.events for event in read_event_log(path)]
    except (EventLogError, OSError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    timeline = build_timeline(events)
    if not timeline.lanes:
        print(f"{PROG}: error: no events in {', '.join(args.events)}", file=sys.stderr)
        return 2
    render_timeline(timeline, args.output, title=args.title or ", ".join(args.events))
    print(
        f"wrote {args.output}: {len(timeline.lanes)} lanes, {len(timeline.spans)} spans, "
        f"{len(timeline.marks)} marks over {timeline.duration:.2f} s"
    )
    return 0
