"""The README stays a short introduction whose links all lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_relative_link_of_the_readme_names_a_file() -> None:
    """Each `[text](path)` link that is not a URL names a file of the repository."""
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", README)]
    relative = [t for t in targets if t and "://" not in t]
    assert len(relative) > 10
    assert [t for t in relative if not (ROOT / t).is_file()] == []


def test_the_first_section_gives_exactly_the_two_commands() -> None:
    """The first section's only code block is `make demo` and `make test`."""
    first = README.split("\n## ", 2)[1]
    blocks = re.findall(r"```\w*\n(.*?)```", first, re.DOTALL)
    commands = [line.split("#")[0].strip() for line in blocks[0].splitlines()]
    assert (len(blocks), commands) == (1, ["make demo", "make test"])


def test_the_readme_stays_short() -> None:
    """About 150 lines: the rest belongs on the site."""
    assert len(README.splitlines()) <= 160
