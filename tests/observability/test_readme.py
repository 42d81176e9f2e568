"""The README's test-kit snippet is a working test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parents[2] / "README.md"


def section_code(title: str) -> str:
    """The first python block of the README section ``title``."""
    section = README.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, f"no python block in the README's {title!r} section"
    return found.group(1)


async def test_the_readme_testing_kit_example_passes() -> None:
    """The user test shown under 'Testing kit' runs and its assertions hold."""
    namespace: dict[str, Any] = {}
    exec(compile(section_code("Testing kit"), str(README), "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    await tests[0]()
