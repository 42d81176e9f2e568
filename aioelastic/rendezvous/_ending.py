"""A clean ending: every participant reads the end of the run before the store's host leaves.

Theory of operation. On ``c10d`` one node serves the store the others talk to; when it leaves,
the store goes with it. A node that hosts the store therefore leaves last: before it stops the
server it waits, bounded by ``host_leave_timeout``, until every *participant* of the last round
(its members, and the nodes joined to the round after it) has *settled*, as the store shows it:

* it read the end (``round/<r>/seen/<node>``, written by the participant before its
  ``wait_round_invalidated()`` or ``next_rendezvous()`` returns the close, or the loss of a
  participant that left, to its caller: :func:`worth_reading_back`);
* it moved on to the next round (a join record there), unless that round is the closed one:
  then it must read the close too;
* or it is gone: it left (its liveness key deleted, after its own loss report) or died (the
  key expired).

When every participant already settled (the usual case) the host reads the store once and
leaves at once. Pure: :func:`unsettled` judges what the host read; :func:`wait_settled` is the
thin shell that reads and waits on the store.

The other side: a participant whose store server is gone learns it from the store client
(:class:`~aioelastic.store.StoreServerGone`: every reconnection was refused) and ends its round
as ``STORE_LOST`` at once, without waiting for its liveness lease to lapse.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aioelastic._clock import Clock, move_on_at
from aioelastic._concurrency import first_of
from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous._info import InvalidationReason, RoundInvalidated
from aioelastic.store import Store, StoreError

logger = logging.getLogger("aioelastic.rendezvous._elastic")  # the handler's, as it was

LEFT = "left"
"""What a member that leaves writes as its own loss report."""

DEFAULT_HOST_LEAVE_TIMEOUT = 30.0
"""Seconds the store's host waits, at most, for the participants to read the end."""


@dataclass(slots=True)
class Hosting:
    """Whether this node serves the run's store (the store's opener says so once it knows),
    and how long it waits for the participants when it leaves (``host_leave_timeout``)."""

    timeout: float = DEFAULT_HOST_LEAVE_TIMEOUT
    here: bool = False


def _ids_under(items: Iterable[str], head: str) -> set[int]:
    return {int(key[len(head) :]) for key in items if key.startswith(head)}


def unsettled(
    members: Iterable[int],
    inbox: Mapping[str, bytes],
    inbox_round: int,
    alive: frozenset[int],
    host: int,
) -> frozenset[int]:
    """The participants that may still need the store (see the module docstring).

    ``members``: of round ``inbox_round - 1``; ``inbox``: the keys of round ``inbox_round``
    (relative to the run); ``alive``: the nodes whose liveness key is there; ``host``: this
    node, which never waits for itself.
    """
    head = layout.round_prefix(inbox_round)
    closed = inbox.get(head + "result") == layout.CLOSED_RESULT
    joined = _ids_under(inbox, head + "join/")
    settled = _ids_under(inbox, head + "seen/")
    if not closed:
        settled |= joined
    participants = set(members) | joined
    return frozenset(node for node in participants - settled if node != host and node in alive)


def worth_reading_back(
    verdict: RoundInvalidated, inbox: Mapping[str, bytes], inbox_round: int
) -> bool:
    """Whether a member says it read ``verdict`` (what the inbox of round ``inbox_round``
    held): a close, or a participant that left (the store's host among them, maybe); not
    nodes waiting (the member joins the next round) nor a crash (a dead host's store is gone)."""
    if verdict.reason is InvalidationReason.CLOSED:
        return True
    head = layout.round_prefix(inbox_round) + "lost/"
    return verdict.reason is InvalidationReason.PARTICIPANT_LOST and any(
        key.startswith(head) and value == LEFT.encode() for key, value in inbox.items()
    )


async def wait_settled(
    store: Store, host: int, known: int, timeout: float, clock: Clock
) -> frozenset[int]:
    """Wait until every participant of the last round settled, at most ``timeout`` seconds on
    ``clock``; return those that had not (empty: all had). ``store`` is the run's view;
    ``known`` the last round this node completed (``state/latest`` may not show it yet)."""
    state = await store.get_prefix(layout.STATE_PREFIX)
    latest = max(known, int(state.items.get(layout.LATEST_KEY, b"0")))
    pending: frozenset[int] = frozenset()
    with move_on_at(clock, clock.now() + timeout):
        while True:
            sealed, inbox, alive = await store.get_prefixes(
                [layout.result_key(latest), layout.round_prefix(latest + 1), layout.alive_prefix()]
            )
            following = inbox.items.get(layout.result_key(latest + 1))
            if following is not None and following != layout.CLOSED_RESULT:
                latest += 1  # sealed, and state/latest does not say so yet
                continue
            value = sealed.items.get(layout.result_key(latest))
            members = () if value is None else layout.RoundResult.decode(latest, value).members
            pending = unsettled(
                members, inbox.items, latest + 1, layout.parse_alive(alive.items), host
            )
            if not pending:
                return pending
            await first_of(
                functools.partial(
                    store.wait_for_change,
                    layout.round_prefix(latest + 1),
                    after=inbox.revision,
                    timeout=math.inf,
                ),
                functools.partial(
                    store.wait_for_change,
                    layout.alive_prefix(),
                    after=alive.revision,
                    timeout=math.inf,
                ),
            )
    return pending


async def leave_last(
    store: Store, node: int, known: int, run_id: str, hosting: Hosting, clock: Clock
) -> None:
    """As the store's host ``node``: wait until the participants read the end (bounded by
    ``hosting.timeout``); log who had not, if anyone."""
    try:
        pending = await wait_settled(store, node, known, hosting.timeout, clock)
    except StoreError as error:
        logger.warning("rendezvous %r: waiting to leave last failed: %s", run_id, error)
        return
    if pending:
        logger.warning(
            "rendezvous %r: the store's host leaves with node(s) %s still to read the end "
            "after %g s (host_leave_timeout); they will find the store gone",
            run_id,
            ", ".join(map(str, sorted(pending))),
            hosting.timeout,
        )
