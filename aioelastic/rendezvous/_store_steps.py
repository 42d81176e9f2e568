"""The elastic handler's store operations, each a function of the store: the join machine's
commands (:func:`execute`) and the waits of a completed round's watches.

Nothing here keeps state; :mod:`._elastic` decides what to do with what they return.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from aioelastic._clock import Clock, move_on_at
from aioelastic._concurrency import first_of
from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous import _machine as m
from aioelastic.rendezvous._info import RoundInvalidated
from aioelastic.store import Snapshot, Store, StoreTimeoutError

S = TypeVar("S", bound=m.CompareSetStep)
T = TypeVar("T")


async def before(clock: Clock, deadline: float, call: Callable[[], Awaitable[T]]) -> T | None:
    """Return what ``call()`` returns, or None if ``deadline`` (on ``clock``) comes first."""
    with clock.move_on_at(deadline):
        return await call()
    return None


def state_read(snapshot: Snapshot) -> m.StateRead:
    """What a read of ``state/`` says: the last sealed round, and whether the run is closed."""
    latest = int(snapshot.items.get(layout.LATEST_KEY, b"0"))
    return m.StateRead(latest, layout.CLOSED_KEY in snapshot.items)


async def execute(store: Store, clock: Clock, command: m.Command) -> m.Event:
    """Perform one command of the join machine against ``store``; return its outcome."""
    match command:
        case m.ReadState():
            return state_read(await store.get_prefix(layout.STATE_PREFIX))
        case m.Arrive(round_, record, read_state):
            if store.counts_keys:
                keys, values, counted = layout.counted_arrival(round_, record)
                if read_state:
                    arrival, state = await store.multi_set_count_and_read(
                        keys, values, prefix=counted, read=layout.STATE_PREFIX
                    )
                    return m.Arrived(arrival, state_read(state))
                return m.Arrived(await store.multi_set_and_count(keys, values, prefix=counted))
            await store.set(layout.join_key(round_, record.node), record.encode())
            return m.Arrived(await store.add(layout.count_key(round_), 1))
        case m.AwaitResult(round_, deadline):
            with move_on_at(clock, deadline):
                return m.ResultSeen(await store.get(layout.result_key(round_), timeout=math.inf))
            return m.DeadlineReached()
        case m.ReadCandidates(round_):
            joins, alive = await store.get_prefixes(
                [layout.join_prefix(round_), layout.alive_prefix()]
            )
            records = layout.parse_records(joins.items)
            return m.Candidates(records, layout.parse_alive(alive.items), joins.revision)
        case m.Publish(round_, value):
            stored = await store.compare_set(layout.result_key(round_), b"", value)
            if stored == value:
                await compare_set_until_done(store, m.AdvanceLatest.first(round_))
            return m.Published(stored)
        case m.AwaitJoins(round_, deadline, lapsed, after):
            changed = False
            with clock.move_on_at(deadline):
                await await_joins(store, round_, lapsed, after)
                changed = True
            if not changed:
                return m.DeadlineReached()
            sealed = await store.get_prefix(layout.result_key(round_))
            found = sealed.items.get(layout.result_key(round_))
            return m.JoinsChanged() if found is None else m.ResultSeen(found)
        case m.Withdraw(round_, node):
            joined = await store.get_prefix(layout.join_prefix(round_))
            living = layout.parse_alive((await store.get_prefix(layout.alive_prefix())).items)
            live = len(m.live_joiners(layout.parse_records(joined.items), living))
            await store.delete_key(layout.join_key(round_, node))
            sealed = await store.get_prefix(layout.result_key(round_))
            return m.Withdrawn(sealed.items.get(layout.result_key(round_)), live)
    raise AssertionError(f"not a store command: {command!r}")  # pragma: no cover


async def compare_set_until_done(store: Store, step: S) -> S:
    """Run the machine's compare-and-set loop from ``step``; return its last step."""
    while True:
        following = step.then(await store.compare_set(step.key, step.expected, step.desired))
        if following is None:
            return step
        step = following


async def await_joins(store: Store, round_: int, lapsed: frozenset[int], after: int) -> None:
    """Return once the round changed or a lapsed joiner's liveness key is back."""
    change = functools.partial(
        store.wait_for_change, layout.round_prefix(round_), after=after, timeout=math.inf
    )
    if not lapsed:  # the usual case: no race, no task
        await change()
        return
    await first_of(
        change,
        *(
            functools.partial(store.wait, [layout.alive_key(node)], timeout=math.inf)
            for node in lapsed
        ),
    )


async def inbox_verdict(
    store: Store, result: layout.RoundResult
) -> tuple[RoundInvalidated, Mapping[str, bytes]]:
    """Return once the keys of the round after ``result`` say it is over, why, and those keys:
    wait for the inbox's doorbell, then read it until :func:`~._machine.assess_inbox` judges."""
    prefix = layout.round_prefix(result.round + 1)
    await store.wait([layout.count_key(result.round + 1)], timeout=math.inf)
    snapshot = await store.get_prefix(prefix)
    members, round_ = result.members, result.round
    while (verdict := m.assess_inbox(members, round_, snapshot.items)) is None:
        await store.wait_for_change(prefix, after=snapshot.revision, timeout=math.inf)
        snapshot = await store.get_prefix(prefix)
    return verdict, snapshot.items


async def successor_gone(store: Store, clock: Clock, successor: int, timeout: float) -> None:
    """Return once ``successor``'s liveness key is gone, or once no renewal of it was seen
    for ``timeout`` (on ``clock``) and a fresh read confirms none came: a store may keep the
    key longer than its TTL (etcd may refresh leases when a new leader is promoted)."""
    prefix, key = layout.alive_prefix(successor), layout.alive_key(successor)
    snapshot = await store.get_prefix(prefix)
    seen = clock.now()
    while key in snapshot.items:
        changed = False
        with move_on_at(clock, seen + timeout):
            await store.wait_for_change(prefix, after=snapshot.revision, timeout=math.inf)
            changed = True
        if not changed:
            try:
                await store.wait_for_change(prefix, after=snapshot.revision, timeout=0)
            except StoreTimeoutError:
                return
        seen = clock.now()
        snapshot = await store.get_prefix(prefix)
