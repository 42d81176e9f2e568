"""The elastic rendezvous's key layout and records: where each fact lives and how it is encoded.

Keys are relative to the run's namespace (``rdzv/<run_id>/``):

* ``state/latest``: the last sealed round (it only moves forward), ``state/closed``: the job is
  over, ``state/node_ids``: the counter node ids are taken from;
* ``round/<r>/join/<node>``: a :class:`JoinRecord`; ``round/<r>/count``: the arrival counter
  on a store with an atomic add, a plain marker on one that counts the join records instead
  (:func:`counted_arrival`); either way the doorbell of that round as the inbox of round
  ``r - 1``; ``round/<r>/result``: the
  sealed :class:`RoundResult`, or ``closed``; ``round/<r>/lost/<node>``: a member of round
  ``r - 1`` reported gone; ``round/<r>/seen/<node>``: a participant read the end of round
  ``r - 1`` (closed, or a participant lost; the store's host waits for these before it
  leaves, :mod:`._ending`);
* ``node/<node>/alive``: the liveness key, written with a TTL (:func:`encode_alive`).

Pure: no I/O. The protocol that reads and writes these keys is :mod:`._machine`.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, SupportsIndex

from aioelastic.rendezvous._errors import RendezvousStateError

# -- keys, relative to the run's namespace -----------------------------------------------------

CLOSED_KEY = "state/closed"
LATEST_KEY = "state/latest"
NODE_IDS_KEY = "state/node_ids"
STATE_PREFIX = "state/"
CLOSED_RESULT = b"closed"


def round_prefix(round_: int) -> str:
    """Everything about round ``round_``; members of the round before watch it as their inbox."""
    return f"round/{round_}/"


def join_prefix(round_: int) -> str:
    return f"round/{round_}/join/"


def join_key(round_: int, node: int) -> str:
    return f"round/{round_}/join/{node}"


def count_key(round_: int) -> str:
    """The arrival counter of a round; it doubles as the doorbell of that round's inbox:
    whoever reports a loss or closes the run there adds 0 to it, so the members of the round
    before wait for one key to appear instead of re-reading a prefix."""
    return f"round/{round_}/count"


DOORBELL = b"0"
"""What an arrival counted by key writes to the round's counter key: it rings the doorbell and
parses as a count of 0 for the adds of 0 that ring it too."""


def counted_arrival(round_: int, record: JoinRecord) -> tuple[list[str], list[bytes], str]:
    """An arrival on a store that counts keys as it writes (``Store.multi_set_and_count``):
    the keys and values to write, the join record and the doorbell, and the prefix whose key
    count, once they are written, is the arrival number: the round's join records."""
    keys = [join_key(round_, record.node), count_key(round_)]
    return keys, [record.encode(), DOORBELL], join_prefix(round_)


def result_key(round_: int) -> str:
    return f"round/{round_}/result"


def lost_key(round_: int, node: int) -> str:
    """Where a member of round ``round_ - 1`` is reported gone."""
    return f"round/{round_}/lost/{node}"


def seen_key(round_: int, node: int) -> str:
    """Where a participant says it read the end (a close, a loss) in round ``round_``."""
    return f"round/{round_}/seen/{node}"


def alive_prefix(node: int | None = None) -> str:
    return "node/" if node is None else f"node/{node}/"


def alive_key(node: int) -> str:
    return f"node/{node}/alive"


_HEARTBEAT_TIMEOUT_TAG = b"ttl="


def encode_alive(heartbeat_timeout: float) -> bytes:
    """A liveness key's value: the TTL it is written with, so readers can age the heartbeat."""
    return _HEARTBEAT_TIMEOUT_TAG + repr(float(heartbeat_timeout)).encode()


def parse_heartbeat_timeout(value: bytes) -> float | None:
    """The TTL a liveness key value records (None for a value without one, e.g. ``b"1"``)."""
    if not value.startswith(_HEARTBEAT_TIMEOUT_TAG):
        return None
    try:
        timeout = float(value[len(_HEARTBEAT_TIMEOUT_TAG) :])
    except ValueError:
        return None
    return timeout if timeout > 0 and math.isfinite(timeout) else None


def parse_alive(items: Iterable[str]) -> frozenset[int]:
    """The node ids whose liveness key is among ``items`` (keys relative to the namespace)."""
    return frozenset(int(key.split("/")[1]) for key in items if key.endswith("/alive"))


# -- records -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinRecord:
    """What a node tells the round it joins: where it is and what rank it had last round."""

    node: int
    addr: str
    port: int
    prev_round: int = 0
    prev_rank: int = -1

    def encode(self) -> bytes:
        return json.dumps([self.addr, self.port, self.prev_round, self.prev_rank]).encode()

    @classmethod
    def decode(cls, node: int, data: bytes) -> JoinRecord:
        try:
            addr, port, prev_round, prev_rank = json.loads(data)
            return cls(node, str(addr), int(port), int(prev_round), int(prev_rank))
        except (ValueError, TypeError) as error:
            raise RendezvousStateError(
                f"join record of node {node} is malformed ({data[:60]!r}): {error}; "
                "is another program or version using this run id?"
            ) from None


def parse_records(items: Mapping[str, bytes]) -> dict[int, JoinRecord]:
    """Decode the join records among ``items`` (keys ``.../join/<node>``)."""
    records = {}
    for key, data in items.items():
        node = int(key.rsplit("/", 1)[1])
        records[node] = JoinRecord.decode(node, data)
    return records


class Members(tuple[int, ...]):
    """Node ids in rank order; ``index`` and ``in`` are dict lookups, not scans, so each of N
    nodes finding itself (or its ring successor) in a round of N costs O(1), not O(N)."""

    _ranks: dict[int, int]

    def __new__(cls, nodes: Iterable[int]) -> Members:
        self = super().__new__(cls, nodes)
        self._ranks = {node: rank for rank, node in enumerate(self)}
        return self

    def index(self, value: Any, start: SupportsIndex = 0, stop: SupportsIndex = sys.maxsize) -> int:
        rank = self._ranks.get(value)
        if rank is None or not (int(start) == 0 and int(stop) == sys.maxsize):
            return super().index(value, start, stop)
        return rank

    def __contains__(self, value: object) -> bool:
        return value in self._ranks

    def rank(self, node: int) -> int | None:
        """The rank of ``node``, or None if it is not a member."""
        return self._ranks.get(node)

    def __repr__(self) -> str:
        return tuple.__repr__(self)


@dataclass(frozen=True, slots=True)
class RoundResult:
    """A sealed round: its members in rank order and where rank 0 is."""

    round: int
    members: tuple[int, ...]
    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if not isinstance(self.members, Members):
            object.__setattr__(self, "members", Members(self.members))

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, node: int) -> int | None:
        members = self.members
        assert isinstance(members, Members)  # __post_init__ made it one
        return members.rank(node)

    def encode(self) -> bytes:
        return json.dumps([self.master_addr, self.master_port, self.members]).encode()

    @classmethod
    def decode(cls, round_: int, data: bytes) -> RoundResult:
        return _decode_result(round_, data)


@functools.lru_cache(maxsize=8)
def _decode_result(round_: int, data: bytes) -> RoundResult:
    """Decode a result once per process: the nodes of a simulation all read the same bytes."""
    try:
        addr, port, members = json.loads(data)
        return RoundResult(round_, Members(int(m) for m in members), str(addr), int(port))
    except (ValueError, TypeError) as error:
        raise RendezvousStateError(
            f"result of round {round_} is malformed ({data[:60]!r}): {error}; "
            "is another program or version using this run id?"
        ) from None
