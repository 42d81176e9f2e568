"""The cyclic collector's young generation, sized to a simulation of many nodes while it runs.

Theory of operation. A simulation runs N nodes in one event loop, taking turns: anything a
node holds across an ``await`` (its waiting store call, its deadline's scope, its place in the
ready queue) stays alive while the other N - 1 nodes take theirs. CPython's collector examines
its young generation every 700 net allocations, a number that does not grow with N, so from a
few hundred nodes up every such object outlives two young collections and is promoted to the
oldest generation (measured: about 120 objects a node in one round of 5,000, none of them
garbage). Promotions past a quarter of the oldest generation start a full collection, which
walks every object of every node: none in a round of 1,000 nodes (fewer than the ten middle
collections a full one also waits for), three in a round of 10,000 (half the round's CPU),
eight while 10,000 nodes are started. So the collector, not the protocol, made the kit's cost
grow faster than N. With the young generation at ``YOUNG_PER_NODE`` allocations a node, a
node's objects die before the collector looks at them and a round runs no full collection.

Only the first threshold moves, only while a simulation is entered, and back to what it was
when the last one leaves (unless someone set another meanwhile: theirs stays). It changes when
the collector runs, not what it collects.
"""

from __future__ import annotations

import gc

YOUNG_PER_NODE = 100
"""Allocations a simulated node may make between two young collections."""

_held: list[int] = []
"""The young threshold each entered simulation asked for."""
_base: int | None = None
"""The threshold before the first of them (or the one set since by someone else)."""
_ours: int | None = None
"""The threshold this module set last."""


def hold_young_generation(nodes: int) -> int:
    """Raise the young generation's threshold to fit ``nodes`` simulated nodes (never lower
    it); return the request, for :func:`release_young_generation`."""
    global _base
    if not _held:
        _base = gc.get_threshold()[0]
    wanted = YOUNG_PER_NODE * nodes
    _held.append(wanted)
    _apply()
    return wanted


def release_young_generation(wanted: int) -> None:
    """Drop one request of :func:`hold_young_generation`; the last one restores the threshold."""
    global _base, _ours
    _held.remove(wanted)
    _apply()
    if not _held:
        _base = _ours = None


def _apply() -> None:
    global _base, _ours
    young, *older = gc.get_threshold()
    if _ours is not None and young != _ours:
        _base = young  # set by someone else while we held it: that is the base now
    assert _base is not None
    _ours = max(_base, *_held) if _held and _base else _base  # 0: collection is off, stays off
    gc.set_threshold(_ours, *older)
