"""Stress: the README's embedded rendezvous, 3 and 8 processes, run after run.

Every participant must return CLOSED, nothing may be written to stderr (no warning), and with
the store's host SIGKILLed every other process must learn STORE_LOST. Before the store's host
left last, 6 of 20 runs of 3 processes ended FENCED after 11 s on some node.
"""

from __future__ import annotations

import pytest

from stress.conftest import Figures
from stress.embedded_rendezvous import run_embedded_rendezvous

RUNS = 200
KILLED_RUNS = 50


@pytest.mark.parametrize("nodes", [3, 8])
def test_every_node_of_the_embedded_rendezvous_sees_the_close(nodes: int, figures: Figures) -> None:
    """200 runs: every process returns CLOSED without a warning."""
    failures = run_embedded_rendezvous(RUNS, nodes)
    figures["runs"], figures["failures"] = RUNS, len(failures)
    assert not failures, [(f.run, f.reason, f.outputs) for f in failures[:3]]


def test_every_node_learns_the_killed_store_host() -> None:
    """50 runs with the store's host SIGKILLed: every other process returns STORE_LOST."""
    failures = run_embedded_rendezvous(KILLED_RUNS, 3, kill_host=True)
    assert not failures, [(f.run, f.reason, f.outputs) for f in failures[:3]]
