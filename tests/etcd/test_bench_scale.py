"""``bench.scale`` over a real etcd: a small point runs both phases with etcd's own calls.

The bench's meter wraps each node's store; a meter that does not hand on an optional operation
makes the bench measure requests production does not make (the sealer's one-transaction read
split into two, the arrival's transaction into a write and reads). A wrapper once missing a new
store call broke this backend of the bench for an hour: this runs it.
"""

from __future__ import annotations

import math

import pytest

from aioelastic.testing import EtcdCluster
from bench.scale import etcd_point

NODES = 10


@pytest.mark.etcd
@pytest.mark.parametrize("shared", [False, True], ids=["client-a-node", "one-client"])
def test_a_small_etcd_point_forms_loses_a_node_and_reforms(
    etcd_server: EtcdCluster, shared: bool
) -> None:
    """Formation and the survivors' round both finish; each arrival is one transaction and the
    sealer's read of joins and liveness keys is one call."""
    process = etcd_server.members[0].process
    assert process is not None
    point = etcd_point(NODES, etcd_server.endpoints, process.pid, shared=shared)
    assert math.isfinite(point.formation.seconds)
    assert math.isfinite(point.loss.seconds)
    formation = point.formation.ops
    assert formation["multi_set_count_and_read"] == NODES
    assert "set" not in formation  # arrivals wrote only through their transaction
    assert formation["get_prefixes"] == 1
    assert point.loss.ops["multi_set_count_and_read"] == NODES - 1
