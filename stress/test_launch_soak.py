"""The launch soak (``stress.launch_soak``): every cell, ``SOAK_RUNS`` runs (200 by default),
ours and torchrun's side by side. We may lose no run: not one failure, SIGABRT, hang or orphan."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from aioelastic.testing import find_etcd_binary
from stress.conftest import Figures
from stress.launch_soak import Cell, matrix, soak, table

RUNS = int(os.environ.get("SOAK_RUNS", "200"))

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


def cell_id(cell: Cell) -> str:
    return cell.name.replace(" ", "-")


@pytest.mark.parametrize("cell", matrix(), ids=cell_id)
def test_every_launch_finishes(cell: Cell, figures: Figures, tmp_path: Path) -> None:
    """Every run of the cell ends with every launcher at status 0 and nothing of it left."""
    if cell.topology == "etcd" and find_etcd_binary() is None:
        pytest.skip("the etcd cells need the etcd binary (apt-get install etcd-server)")
    endpoints = None
    if cell.topology == "etcd":
        from stress.launch_soak import etcd_server

        with etcd_server(tmp_path) as endpoints:
            tallies = soak([cell], RUNS, etcd_endpoints=endpoints, keep=tmp_path / "lost")
    else:
        tallies = soak([cell], RUNS, keep=tmp_path / "lost")
    tally = tallies[cell.name]
    figures["table"] = table(tallies)
    if cell.launcher == "torchrun":
        return  # the reference: its losses are the table's, not ours to fail on
    lost = [o for o in tally.outcomes if o.verdict != "ok"]
    assert not lost, f"{len(lost)} of {RUNS} runs lost; the first:\n{lost[0].console[-4000:]}"
