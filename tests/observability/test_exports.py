"""The public surface of the observability parts is exactly what we meant."""

from __future__ import annotations

import aioelastic.testing


def test_testing_kit_exports_its_names() -> None:
    """aioelastic.testing exports the clock, the cluster and the fault injectors, and they exist."""
    expected = {
        "DEFAULT_CONFIG",
        "EventRecorder",
        "FaultyStore",
        "FaultyStoreStatistics",
        "ManualClock",
        "Node",
        "RendezvousCluster",
        "Stall",
    }
    assert set(aioelastic.testing.__all__) == expected
    assert all(hasattr(aioelastic.testing, name) for name in expected)
