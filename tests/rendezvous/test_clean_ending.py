"""The README's embedded rendezvous in real processes (a short form of ``make stress``'s run):
every ending path leaves every process with the right verdict and no warning."""

from __future__ import annotations

import pytest

from stress.embedded_rendezvous import run_embedded_rendezvous


@pytest.mark.parametrize("nodes", [3, 8])
def test_every_process_of_the_embedded_rendezvous_sees_the_close(nodes: int) -> None:
    """Three runs: rank 0 closes, every process returns CLOSED and writes no warning."""
    failures = run_embedded_rendezvous(3, nodes)
    assert not failures, [(f.run, f.reason, f.outputs) for f in failures]


@pytest.mark.parametrize("ending", ["host-closes", "leave"])
def test_every_process_ends_cleanly_whoever_ends_the_job(ending: str) -> None:
    """The store's host closes, or every rank leaves at once: no process writes a warning."""
    failures = run_embedded_rendezvous(2, 3, ending=ending)
    assert not failures, [(f.run, f.reason, f.outputs) for f in failures]


def test_the_others_learn_that_the_store_host_was_killed() -> None:
    """The store's host is SIGKILLed after the round: the others return STORE_LOST."""
    failures = run_embedded_rendezvous(2, 3, ending="kill-host")
    assert not failures, [(f.run, f.reason, f.outputs) for f in failures]
