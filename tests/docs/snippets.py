"""Find the runnable snippets of the docs: every fenced ```python block of a page.

The convention (for every page under docs/ and README.md): a ```python block is a standalone
script that the tests run (cwd a temporary directory, 60 s); ```py marks a fragment that cannot
run alone, and ```bash/```console/```text are not run. Two optional marks:

- a ```text block with ``title="Output"`` right after a python block is the exact stdout the
  script must print;
- an HTML comment ``<!-- docs-test: ... -->`` on the line above a block: ``etcd`` gives it a
  fresh one-member etcd (``127.0.0.1:2379`` in the snippet is replaced by that etcd's
  endpoint); ``aioelastic-run`` runs it as a training script under
  ``aioelastic run --standalone --nproc-per-node 2`` (see :data:`LAUNCH`).

A snippet that imports torch is skipped where torch is not installed. The parsing here is pure.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDS = frozenset({"etcd", "aioelastic-run"})
"""What a ``<!-- docs-test: ... -->`` comment may ask for."""

LAUNCH = ("-m", "aioelastic", "run", "--standalone", "--nproc-per-node", "2")
"""How an ``aioelastic-run`` snippet is started (after the python executable)."""

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_MARK = re.compile(r"<!--\s*docs-test:\s*(?P<needs>[^>]*?)\s*-->\s*\Z")


@dataclass(frozen=True)
class Snippet:
    """One runnable python block: where it is, its code, what it needs and must print."""

    page: str
    line: int
    code: str
    needs: frozenset[str] = frozenset()
    output: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def imports_torch(self) -> bool:
        """Whether the script imports torch (it is skipped where torch is not installed)."""
        for node in ast.walk(ast.parse(self.code)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] == "torch" for name in names):
                return True
        return False


def snippets_in(text: str, page: str) -> Iterator[Snippet]:
    """The python snippets of one markdown page, with their marks and expected output."""
    fences = list(_FENCE.finditer(text))
    for index, fence in enumerate(fences):
        words = fence["info"].split()
        if not words or words[0] != "python":
            continue
        line = text.count("\n", 0, fence.start()) + 1
        needs: frozenset[str] = frozenset()
        mark = _MARK.search(text, 0, fence.start())
        if mark is not None and text[mark.end() : fence.start()].strip() == "":
            needs = frozenset(filter(None, re.split(r"[\s,]+", mark["needs"])))
            if not needs <= NEEDS:
                raise ValueError(
                    f"{page}:{line}: docs-test mark asks for {sorted(needs - NEEDS)}; "
                    f"known: {sorted(NEEDS)}"
                )
        output = None
        if index + 1 < len(fences):
            after = fences[index + 1]
            between = text[fence.end() : after.start()]
            if between.strip() == "" and re.fullmatch(r'text\s+title="Output"', after["info"]):
                output = textwrap.dedent(after["body"])
        yield Snippet(page, line, textwrap.dedent(fence["body"]), needs, output)


def doc_pages() -> list[Path]:
    """README.md and every markdown page of the site's sources."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_snippets(pages: Iterable[Path] | None = None) -> list[Snippet]:
    """Every python snippet of ``pages`` (default: :func:`doc_pages`)."""
    found: list[Snippet] = []
    for path in doc_pages() if pages is None else pages:
        found.extend(snippets_in(path.read_text(), str(path.relative_to(ROOT))))
    return found
