"""Prometheus metrics for elastic jobs (optional extra ``aioelastic[metrics]``).

:class:`PrometheusMetrics` subscribes to an :class:`~aioelastic.events.EventStream`;
:func:`serve_metrics` serves them (``aioelastic run --metrics-port``). Importing this package
works without prometheus-client; creating the metrics raises :class:`MetricsUnavailableError`.
"""

from aioelastic.metrics._prometheus import (
    DURATION_BUCKETS,
    MetricsPortError,
    MetricsUnavailableError,
    PrometheusMetrics,
    metrics_listener,
    serve_metrics,
)

__all__ = [
    "DURATION_BUCKETS",
    "MetricsPortError",
    "MetricsUnavailableError",
    "PrometheusMetrics",
    "metrics_listener",
    "serve_metrics",
]
