"""The public surface of the observability parts is exactly what we meant."""

from __future__ import annotations

import types

import pytest

import aioelastic.events
import aioelastic.metrics
import aioelastic.testing

SURFACES = {
    aioelastic.testing: {
        "DEFAULT_CONFIG",
        "HOW_TO_GET_ETCD",
        "EtcdCluster",
        "EtcdMember",
        "EventRecorder",
        "FaultUnsupportedError",
        "FaultyStore",
        "FaultyStoreStatistics",
        "Host",
        "ManualClock",
        "Network",
        "NetworkUnavailableError",
        "Node",
        "ProtocolViolation",
        "RendezvousCluster",
        "SimulatedWorker",
        "Stall",
        "WorldSimulation",
        "find_etcd_binary",
        "unavailable_reason",
    },
    aioelastic.events: {
        "WARNING_KINDS",
        "Emitter",
        "EventLogError",
        "EventRecord",
        "EventStream",
        "EventStreamStatistics",
        "JsonLinesWriter",
        "LoggedEvent",
        "LoggingSubscriber",
        "RendezvousWaiting",
        "Subscriber",
        "decode_line",
        "encode_record",
        "observe",
        "read_event_log",
        "to_data",
        "watch_rendezvous",
    },
    aioelastic.metrics: {
        "DURATION_BUCKETS",
        "MetricsPortError",
        "MetricsUnavailableError",
        "PrometheusMetrics",
        "metrics_listener",
        "serve_metrics",
    },
}


@pytest.mark.parametrize("module", list(SURFACES), ids=lambda m: m.__name__)
def test_a_package_exports_exactly_its_names(module: types.ModuleType) -> None:
    """__all__ lists the intended names, each one exists, and nothing private leaks."""
    assert set(module.__all__) == SURFACES[module]
    assert all(hasattr(module, name) for name in module.__all__)
