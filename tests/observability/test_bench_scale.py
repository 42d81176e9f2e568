"""``bench.scale`` over the memory and TCP stores: a small point runs both phases."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.scale import CHART, SIZES, Point, chart_for, memory_point, tcp_point

NODES = 10


@pytest.mark.parametrize("make_point", [memory_point, tcp_point], ids=["memory", "tcp"])
def test_a_small_point_forms_loses_a_node_and_reforms(make_point: Callable[[int], Point]) -> None:
    """Both phases finish and count what the nodes did: one ``add`` a node (its arrival) and
    the sealer's read of the joins and the liveness keys as one call."""
    point = make_point(NODES)
    assert math.isfinite(point.formation.seconds)
    assert math.isfinite(point.loss.seconds)
    assert point.formation.ops["get_prefixes"] == 1
    assert point.formation.ops["add"] == NODES


def test_only_a_whole_run_or_a_report_replaces_the_published_chart(tmp_path: Path) -> None:
    """A run of some backends or sizes draws no chart unless asked where (it once left the
    published chart with etcd's two points alone)."""
    every = list(SIZES)
    assert chart_for(None, every, None, False, None) == CHART
    assert chart_for(None, every, None, False, [tmp_path / "points.json"]) == CHART
    assert chart_for(None, ["etcd"], None, False, None) is None
    assert chart_for(None, every, [1000], False, None) is None
    assert chart_for(None, every, None, True, None) is None
    assert chart_for(tmp_path / "mine.png", ["etcd"], None, True, None) == tmp_path / "mine.png"
