"""``worker.hand_over``: the job's state from the lowest survivor to the fresh ranks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aioelastic import worker
from aioelastic.worker._protocol import WorldAssigned

HELPER = str(Path(__file__).parent / "workers" / "handover.py")
BOUND = 120
"""Seconds three processes that import torch may take on a busy machine."""


def test_without_a_fresh_rank_the_values_come_back_untouched() -> None:
    """No fresh rank (torchrun, or a world nobody joined): nothing is sent, nothing changes."""
    assigned = WorldAssigned(3, 1, 2, 1, False, 0, (), {"kind": "file", "path": "x"}, 10.0)
    extra = {"seen": 1}
    got = worker.hand_over(worker.World(assigned, None), step=12, extra=extra)
    assert got == worker.HandedOver(12, extra, received=False, synced=False)


def run_world(tmp_path: Path, *flags: str) -> list[subprocess.CompletedProcess[str]]:
    processes = [
        subprocess.Popen(
            [sys.executable, HELPER, str(tmp_path), str(rank), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(3)
    ]
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=BOUND)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out))
    return results


def load(path: Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(path, weights_only=False)
    return state


def same(a: Any, b: Any) -> bool:
    """Equal, tensors by value (nested in dicts, lists and tuples)."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_fresh_rank_gets_the_sources_state_and_the_survivors_keep_theirs(
    tmp_path: Path,
) -> None:
    """Rank 2 (fresh) ends with rank 0's module (buffers too), Adam state, step, extra and RNG
    states; rank 1 (a survivor that is not the source) keeps its own."""
    results = run_world(tmp_path)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stdout for r in results]
    source, other, fresh = (load(tmp_path / f"{rank}.pt") for rank in range(3))
    for key in ("model", "optimizer", "step", "extra", "torch_rng", "random"):
        assert same(source[key], fresh[key]), key
    assert fresh["step"] == 7
    assert fresh["received"] is True
    assert source["received"] is False
    assert [source["synced"], other["synced"], fresh["synced"]] == [True, True, True]
    assert not same(other["model"], fresh["model"])
    assert other["extra"]["object"] == ("a", 1)


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_fresh_rank_that_passes_other_arguments_is_told_what_differs(tmp_path: Path) -> None:
    """The source hands over an optimizer, the fresh rank passed none: it raises HandOverError."""
    results = run_world(tmp_path, "--fresh-without-optimizer")
    assert results[2].returncode == 3, results[2].stdout
    assert (
        "refused: source rank 0 handed over an optimizer and this rank passed none: pass the "
        "same arguments to hand_over on every rank"
    ) in results[2].stdout


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_survivor_at_another_step_takes_the_sources_state_too(tmp_path: Path) -> None:
    """Rank 1 survived a step behind rank 0 (an all_reduce that completed on one survivor
    only): it receives rank 0's state along with the fresh rank, so all three agree."""
    results = run_world(tmp_path, "--survivor-behind")
    assert [r.returncode for r in results] == [0, 0, 0], [r.stdout for r in results]
    source, behind, fresh = (load(tmp_path / f"{rank}.pt") for rank in range(3))
    for key in ("model", "optimizer", "step", "extra", "torch_rng", "random"):
        assert same(source[key], behind[key]), key
        assert same(source[key], fresh[key]), key
    assert behind["received"] is True
