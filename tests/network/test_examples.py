"""The network partition example runs as its docstring says (as root)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "network_partition.py"


async def test_the_partition_example_fences_and_rejoins() -> None:
    """Host 2 is fenced, the others form a world of 2, then all three are one world again."""
    done = await anyio.run_process([sys.executable, str(EXAMPLE)], check=False)
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    assert "host 2: [aioelastic" in output
    assert "fenced: round" in output
    assert "world size 2" in output
    assert "--- back in one world of 3" in output
