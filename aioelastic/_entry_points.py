"""Plug-ins found the way torch finds them: by name in an entry-point group (``torchrun.handlers``
for rendezvous backends, ``torchrun.logs_specs`` for log layouts)."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points


def find_entry_point(group: str, name: str) -> EntryPoint | None:
    """The entry point ``name`` of ``group`` in the installed distributions, if any."""
    found = entry_points(group=group, name=name)
    return next(iter(found), None)
