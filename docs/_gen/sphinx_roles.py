"""A griffe extension: Sphinx roles in docstrings (``:class:`~a.B```) become code spans.

The docstrings are written for reading in an editor, with Sphinx's cross-reference roles;
mkdocstrings renders Markdown, where the role's name would show as text. Keep the name only
(the last component for ``~``), as inline code.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx role replaced by its target as inline code."""

    def name(found: re.Match[str]) -> str:
        target = found[2].split(".")[-1] if found[1] else found[2]
        return f"`{target}`"

    return ROLE.sub(name, text)


class SphinxRoles(Extension):
    """Rewrite the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
