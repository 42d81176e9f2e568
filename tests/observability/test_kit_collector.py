"""The test kit sizes the young generation of the collector to its nodes while it is entered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from aioelastic.testing import RendezvousCluster
from aioelastic.testing._collector import (
    YOUNG_PER_NODE,
    hold_young_generation,
    release_young_generation,
)


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    """Each test starts from CPython's default thresholds and leaves the process as it found it."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_simulation_raises_the_young_threshold_and_its_end_restores_it() -> None:
    """Holding for 20 nodes sets 20 * YOUNG_PER_NODE; releasing puts 700 back; 10, 10 untouched."""
    wanted = hold_young_generation(20)
    assert gc.get_threshold() == (20 * YOUNG_PER_NODE, 10, 10)
    release_young_generation(wanted)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_small_simulation_never_lowers_the_threshold() -> None:
    """Three nodes ask for less than the default: the threshold stays 700."""
    wanted = hold_young_generation(3)
    assert gc.get_threshold()[0] == 700
    release_young_generation(wanted)
    assert gc.get_threshold()[0] == 700


def test_overlapping_simulations_hold_the_largest_until_the_last_leaves() -> None:
    """Two at once: the larger request holds, whichever leaves first; the last restores 700."""
    small, large = hold_young_generation(20), hold_young_generation(50)
    assert gc.get_threshold()[0] == 50 * YOUNG_PER_NODE
    release_young_generation(large)
    assert gc.get_threshold()[0] == 20 * YOUNG_PER_NODE
    release_young_generation(small)
    assert gc.get_threshold()[0] == 700


def test_a_threshold_set_by_someone_else_meanwhile_is_kept() -> None:
    """A caller that sets its own threshold during a simulation keeps it after the release."""
    wanted = hold_young_generation(20)
    gc.set_threshold(5000, 10, 10)
    release_young_generation(wanted)
    assert gc.get_threshold()[0] == 5000


def test_a_collector_turned_off_by_threshold_zero_stays_off() -> None:
    """Threshold 0 disables collection; a simulation does not turn it back on."""
    gc.set_threshold(0, 10, 10)
    wanted = hold_young_generation(20)
    assert gc.get_threshold()[0] == 0
    release_young_generation(wanted)
    assert gc.get_threshold()[0] == 0


@pytest.mark.anyio
async def test_a_cluster_holds_the_threshold_while_entered_and_for_nodes_it_adds() -> None:
    """RendezvousCluster(20) raises it on entry, one more node raises it again, exit restores."""
    async with RendezvousCluster(20) as cluster:
        assert gc.get_threshold()[0] == 20 * YOUNG_PER_NODE
        await cluster.add_node()
        assert gc.get_threshold()[0] == 21 * YOUNG_PER_NODE
    assert gc.get_threshold()[0] == 700
