"""Stress (slow: Lightning and accelerate take tens of seconds to import and train here):
unmodified Lightning DDP and accelerate scripts train to identical weights under torchrun and
`aioelastic run`. Skipped unless `pip install 'aioelastic[interop]'` (lightning, accelerate)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

WORKERS = Path(__file__).parent / "workers"
LAUNCHERS = {
    "aioelastic": [sys.executable, "-m", "aioelastic", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def train(launcher: str, script: str, out: Path) -> dict[str, object]:
    """Run ``script`` on 2 CPU workers under ``launcher``; return the weights rank 0 saved."""
    argv = [*LAUNCHERS[launcher], "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*argv, str(WORKERS / script), str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(torch.load(out))


@pytest.mark.parametrize(
    ("script", "package"),
    [("lightning_ddp.py", "lightning"), ("accelerate_job.py", "accelerate")],
)
def test_a_framework_script_trains_the_same_under_both_launchers(
    script: str, package: str, tmp_path: Path
) -> None:
    """The same script under torchrun and aioelastic run ends with equal weights."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install 'aioelastic[interop]')")
    ours = train("aioelastic", script, tmp_path / "ours.pt")
    theirs = train("torchrun", script, tmp_path / "theirs.pt")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
