"""Every python snippet of the docs and the README runs as a standalone script."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.snippets import LAUNCH, Snippet, all_snippets, snippets_in
from tests.etcd_fixtures import start_cluster

SNIPPETS = all_snippets()
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _param(snippet: Snippet) -> object:
    marks = []
    if snippet.imports_torch:
        marks += [
            pytest.mark.torch,
            pytest.mark.skipif(not HAS_TORCH, reason="the snippet imports torch: not installed"),
        ]
    if "etcd" in snippet.needs:
        marks.append(pytest.mark.etcd)
    return pytest.param(snippet, id=snippet.id, marks=marks)


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The snippet exits 0 (cwd a temporary directory) and prints its Output block if any."""
    code = snippet.code
    cluster = None
    if "etcd" in snippet.needs:
        binary: str = request.getfixturevalue("etcd_binary")
        cluster = start_cluster(binary, tmp_path / "etcd", 1)
        code = code.replace("127.0.0.1:2379", cluster.endpoints)
    script = tmp_path / "snippet.py"
    script.write_text(code)
    launcher = LAUNCH if "aioelastic-run" in snippet.needs else ()
    try:
        done = subprocess.run(
            [sys.executable, *launcher, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,  # the convention's limit: snippets are short
        )
    finally:
        if cluster is not None:
            cluster.stop(timeout=1)
    assert done.returncode == 0, f"{snippet.id} failed:\n{done.stderr}"
    if snippet.output is not None:
        assert done.stdout == snippet.output, f"{snippet.id} printed:\n{done.stdout}"


def test_the_readme_and_every_guide_have_snippets() -> None:
    """The collector finds the README's and the guides' snippets (none found would pass all)."""
    pages = {snippet.page.split("/")[0] for snippet in SNIPPETS}
    assert {"README.md", "docs"} <= pages


def test_marks_and_output_blocks_are_read() -> None:
    """A docs-test mark, an indented fence and an Output block are understood; ```py is not run."""
    text = (
        "<!-- docs-test: etcd -->\n"
        "```python\nprint(1)\n```\n\n"
        '```text title="Output"\n1\n```\n'
        "```py\nnot run\n```\n"
        "- item\n\n    ```python\n    import torch\n    ```\n"
    )
    first, second = snippets_in(text, "page.md")
    assert (first.line, first.code, first.needs, first.output) == (
        2,
        "print(1)\n",
        frozenset({"etcd"}),
        "1\n",
    )
    assert (second.line, second.code, second.needs, second.imports_torch) == (
        14,
        "import torch\n",
        frozenset(),
        True,
    )


def test_an_unknown_mark_is_an_error() -> None:
    """A mark asking for something the runner cannot give fails collection with a clear line."""
    with pytest.raises(ValueError, match=r"page.md:2: docs-test mark asks for \['gpu'\]"):
        list(snippets_in("<!-- docs-test: gpu -->\n```python\npass\n```\n", "page.md"))
