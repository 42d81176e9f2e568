"""Asking every node's agent for its workers' stacks, through the round's store.

Keys (relative to the store a rendezvous round hands its agents, ``info.store``):

* ``aioelastic/stacks/requests``: a counter; a requester ``add``s 1 and gets its request number
  ``n`` (an agent whose timer expired, or ``aioelastic status --stacks``);
* ``aioelastic/stacks/<n>/node/<group rank>``: each agent's answer, JSON: its host and, per
  rank, the capture method, the stack file (a path on that host), the place and why a stack is
  missing;
* ``aioelastic/stacks/incident/node/<group rank>``: an agent's part of the round's hang,
  published (same JSON) once its own report is made: a later investigator reads it instead of
  asking, and every node's agent waits for the others' before it reaps (``_forensics.py``).

Every agent of the round serves requests while its workers run: it waits for the counter to
change (a store watch, no polling), captures, and writes its answer. The requester waits, also
by watching, until every other node answered or its time is up, and names the nodes that did not.
"""

from __future__ import annotations

import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio

from aioelastic.agent._report import StackRecord
from aioelastic.agent._stacks import Place
from aioelastic.store import Store, StoreError

logger = logging.getLogger(__name__)

REQUESTS_KEY = "aioelastic/stacks/requests"
INCIDENT_PREFIX = "aioelastic/stacks/incident/node/"


def answer_prefix(request: int) -> str:
    """Where the answers to request ``request`` go."""
    return f"aioelastic/stacks/{request}/node/"


@dataclass(frozen=True, slots=True)
class RankStack:
    """One rank's capture as an answer carries it: the record and its place."""

    record: StackRecord
    place: Place | None


def encode_answer(stacks: Sequence[RankStack], host: str | None = None) -> bytes:
    """One node's answer."""
    ranks = [
        {
            "rank": s.record.rank,
            "pid": s.record.pid,
            "method": s.record.method,
            "stack_file": s.record.stack_file,
            "reason": s.record.reason,
            "place": None if s.place is None else [s.place.waiting, s.place.where],
        }
        for s in stacks
    ]
    return json.dumps({"host": host or socket.gethostname(), "ranks": ranks}).encode()


def decode_answer(data: bytes) -> tuple[RankStack, ...]:
    """The ranks of one node's answer; raise ValueError when it is not one."""
    try:
        body: Any = json.loads(data)
        host = str(body["host"])
        stacks = []
        for item in body["ranks"]:
            place = item["place"]
            where = None if place is None else Place(bool(place[0]), str(place[1]))
            record = StackRecord(
                rank=int(item["rank"]),
                pid=int(item["pid"]),
                method=item["method"],
                stack_file=None if item["stack_file"] is None else f"{host}:{item['stack_file']}",
                place=None if where is None else where.describe(),
                reason=item["reason"],
            )
            stacks.append(RankStack(record, where))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not a stack answer: {exc!r}") from None
    return tuple(stacks)


async def _gather(
    store: Store, prefix: str, expected: Collection[int], found: dict[int, bytes]
) -> None:
    """Fill ``found`` with the values of ``<prefix><node>`` for every ``expected`` node,
    returning once all are there (by watching the prefix; the caller bounds the wait)."""
    while True:
        snapshot = await store.get_prefix(prefix)
        for key, value in snapshot.items.items():
            node = int(key.rsplit("/", 1)[1])
            if node in expected:
                found.setdefault(node, value)
        if found.keys() >= set(expected):
            return
        await store.wait_for_change(prefix, after=snapshot.revision, timeout=math.inf)


def _decoded(raw: dict[int, bytes], what: str) -> dict[int, tuple[RankStack, ...]]:
    answers = {}
    for node, value in raw.items():
        try:
            answers[node] = decode_answer(value)
        except ValueError as exc:
            logger.warning("node %d answered %s badly: %s", node, what, exc)
            answers[node] = ()
    return answers


async def request_stacks(
    store: Store,
    *,
    nodes: int,
    timeout: float,
    own_node: int | None = None,
    published: bool = False,
) -> tuple[dict[int, tuple[RankStack, ...]], list[int]]:
    """Ask every node (but ``own_node``) of a ``nodes``-node round for its stacks.

    With ``published``, a node that published its part of the round's hang is not asked: that
    part is its answer (it may have reaped and left since). Returns the answers by node and
    the nodes that did not answer within ``timeout``.
    """
    expected = {node for node in range(nodes) if node != own_node}
    answers: dict[int, tuple[RankStack, ...]] = {}
    if published and expected:
        snapshot = await store.get_prefix(INCIDENT_PREFIX)
        raw = {int(key.rsplit("/", 1)[1]): value for key, value in snapshot.items.items()}
        answers = _decoded({n: v for n, v in raw.items() if n in expected}, "its hang")
    asked = expected - answers.keys()
    if not asked:
        return answers, []
    request = await store.add(REQUESTS_KEY, 1)
    found: dict[int, bytes] = {}
    with anyio.move_on_after(timeout):
        await _gather(store, answer_prefix(request), asked, found)
    answers.update(_decoded(found, f"stack request {request}"))
    return answers, sorted(expected - answers.keys())


async def publish_incident(store: Store, node: int, stacks: Sequence[RankStack]) -> None:
    """Publish ``node``'s part of the round's hang (its report is made)."""
    await store.set(f"{INCIDENT_PREFIX}{node}", encode_answer(stacks))


async def wait_for_incidents(
    store: Store, *, nodes: int, own_node: int, skip: Collection[int] = (), timeout: float
) -> list[int]:
    """Wait until every other node of a ``nodes``-node round (but those in ``skip``) published
    its part of the hang; return those that did not within ``timeout`` (a node whose workers
    do not hang never does)."""
    expected = {node for node in range(nodes) if node != own_node and node not in skip}
    found: dict[int, bytes] = {}
    with anyio.move_on_after(timeout):
        await _gather(store, INCIDENT_PREFIX, expected, found)
    return sorted(expected - found.keys())


async def serve_stack_requests(
    store: Store, node: int, answer: Callable[[int], Awaitable[Sequence[RankStack]]]
) -> NoReturn:
    """Answer every stack request made from now on, until cancelled.

    A store failure stops the answering (logged), never the caller: this waits forever then.
    """
    try:
        snapshot = await store.get_prefix(REQUESTS_KEY)
        seen = int(snapshot.items.get(REQUESTS_KEY, b"0"))
        revision = snapshot.revision
        while True:
            revision = await store.wait_for_change(REQUESTS_KEY, after=revision, timeout=math.inf)
            snapshot = await store.get_prefix(REQUESTS_KEY)
            latest = int(snapshot.items.get(REQUESTS_KEY, b"0"))
            for request in range(seen + 1, latest + 1):
                stacks = await answer(request)
                await store.set(f"{answer_prefix(request)}{node}", encode_answer(stacks))
            seen = max(seen, latest)
    except (StoreError, ValueError) as exc:
        logger.warning("node %d stopped answering stack requests: %s", node, exc)
    await anyio.sleep_forever()
    raise AssertionError("unreachable")
