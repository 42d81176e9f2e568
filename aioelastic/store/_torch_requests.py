"""Torch's ``TCPStore`` requests as typed values, one class per :class:`TorchOp`.

:func:`typed_request` turns what the codec decoded (:class:`~._torch_codec.TorchRequest`, an op
and its untyped fields) into one of these; their fields are named and typed, and their keys
are already store keys (torch's client puts ``/`` in front of every key it sends: that one
leading ``/`` is removed, so torch's ``set("k")`` is our ``get("k")``). The torch session's
dispatch table (:mod:`._torch_session`) is keyed by these classes, as the TCP session's is by
those of :mod:`._tcp_requests`. They are named tuples: one is built per request, on the hot
path, and a tuple is the cheapest immutable value to build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from aioelastic.store._torch_codec import TorchOp, TorchRequest


def store_key(wire_key: str) -> str:
    """The store key for a key as torch's client sends it (its leading ``/`` removed)."""
    return wire_key[1:] if wire_key.startswith("/") else wire_key


class TorchValidate(NamedTuple):
    """The first request of a connection: torch's magic number."""

    magic: int


class TorchSet(NamedTuple):
    key: str
    value: bytes


class TorchCompareSet(NamedTuple):
    key: str
    expected: bytes
    desired: bytes


class TorchGet(NamedTuple):
    """Torch's ``GET`` (its client sends a ``WAIT`` first: a missing key reads as empty)."""

    key: str


class TorchAdd(NamedTuple):
    key: str
    amount: int


class TorchCheck(NamedTuple):
    keys: list[str]


class TorchWait(NamedTuple):
    """Held until every key exists (as a key or a non-empty queue), or a ``CANCEL_WAIT``."""

    keys: list[str]


class TorchNumKeys(NamedTuple):
    pass


class TorchDeleteKey(NamedTuple):
    key: str


class TorchAppend(NamedTuple):
    key: str
    value: bytes


class TorchMultiGet(NamedTuple):
    keys: list[str]


class TorchMultiSet(NamedTuple):
    keys: list[str]
    values: list[bytes]


class TorchCancelWait(NamedTuple):
    """The client's own timeout of its ``WAIT`` ran out: withdraw it."""


class TorchPing(NamedTuple):
    nonce: int


class TorchQueuePush(NamedTuple):
    key: str
    value: bytes


class TorchQueuePop(NamedTuple):
    key: str


class TorchQueueLen(NamedTuple):
    key: str


class TorchListKeys(NamedTuple):
    pass


AnyTorchRequest = (
    TorchValidate
    | TorchSet
    | TorchCompareSet
    | TorchGet
    | TorchAdd
    | TorchCheck
    | TorchWait
    | TorchNumKeys
    | TorchDeleteKey
    | TorchAppend
    | TorchMultiGet
    | TorchMultiSet
    | TorchCancelWait
    | TorchPing
    | TorchQueuePush
    | TorchQueuePop
    | TorchQueueLen
    | TorchListKeys
)


def _keyed(cls: Callable[..., AnyTorchRequest]) -> Callable[..., AnyTorchRequest]:
    """The builder of a request whose first field is one key."""

    def build(key: str, *rest: object) -> AnyTorchRequest:
        return cls(store_key(key), *rest)

    return build


def _multi_set(pairs: list[tuple[str, bytes]]) -> TorchMultiSet:
    return TorchMultiSet([store_key(key) for key, _ in pairs], [value for _, value in pairs])


BUILDERS: dict[TorchOp, Callable[..., AnyTorchRequest]] = {
    TorchOp.VALIDATE: TorchValidate,
    TorchOp.SET: _keyed(TorchSet),
    TorchOp.COMPARE_SET: _keyed(TorchCompareSet),
    TorchOp.GET: _keyed(TorchGet),
    TorchOp.ADD: _keyed(TorchAdd),
    TorchOp.CHECK: lambda keys: TorchCheck([store_key(key) for key in keys]),
    TorchOp.WAIT: lambda keys: TorchWait([store_key(key) for key in keys]),
    TorchOp.GETNUMKEYS: TorchNumKeys,
    TorchOp.DELETE_KEY: _keyed(TorchDeleteKey),
    TorchOp.APPEND: _keyed(TorchAppend),
    TorchOp.MULTI_GET: lambda keys: TorchMultiGet([store_key(key) for key in keys]),
    TorchOp.MULTI_SET: _multi_set,
    TorchOp.CANCEL_WAIT: TorchCancelWait,
    TorchOp.PING: TorchPing,
    TorchOp.QUEUE_PUSH: _keyed(TorchQueuePush),
    TorchOp.QUEUE_POP: _keyed(TorchQueuePop),
    TorchOp.QUEUE_LEN: _keyed(TorchQueueLen),
    TorchOp.LIST_KEYS: TorchListKeys,
}
"""How each :class:`TorchOp`'s decoded fields (in the codec's layout order) become its request."""


def typed_request(request: TorchRequest) -> AnyTorchRequest:
    """The typed request of a decoded one."""
    return BUILDERS[request.op](*request.fields)
