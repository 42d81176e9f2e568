"""``bench.scale`` over the memory and TCP stores: a small point runs both phases."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from bench.scale import Point, memory_point, tcp_point

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
