"""Torch's ``TCPStore`` requests as typed values, one class per :class:`TorchOp`.

:func:`typed_decoder` decodes a torch client's stream straight into these (:data:`CLASSES`
says which class each op builds); :func:`typed_request` turns an untyped
:class:`~._torch_codec.TorchRequest` (an op and its fields, as tests and tools write them)
into the same. Their fields are named and typed, and their keys are already store keys
(torch's client puts ``/`` in front of every key it sends: that one leading ``/`` is removed,
so torch's ``set("k")`` is our ``get("k")``). The torch session's dispatch table
(:mod:`._torch_session`) is keyed by these classes, as the TCP session's is by those of
:mod:`._tcp_requests`. They are named tuples: one is built per request, on the hot path, and a
tuple is the cheapest immutable value to build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, cast

from aioelastic.store._torch_codec import (
    DEFAULT_MAX_KEY_SIZE,
    DEFAULT_MAX_KEYS,
    DEFAULT_MAX_VALUE_SIZE,
    REQUEST_LAYOUT,
    TorchDecoder,
    TorchField,
    TorchOp,
    TorchRequest,
    store_key,
)


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


def _multi_set(pairs: list[tuple[str, bytes]]) -> TorchMultiSet:
    return TorchMultiSet([key for key, _ in pairs], [value for _, value in pairs])


CLASSES: dict[TorchOp, Callable[..., AnyTorchRequest]] = {
    TorchOp.VALIDATE: TorchValidate,
    TorchOp.SET: TorchSet,
    TorchOp.COMPARE_SET: TorchCompareSet,
    TorchOp.GET: TorchGet,
    TorchOp.ADD: TorchAdd,
    TorchOp.CHECK: TorchCheck,
    TorchOp.WAIT: TorchWait,
    TorchOp.GETNUMKEYS: TorchNumKeys,
    TorchOp.DELETE_KEY: TorchDeleteKey,
    TorchOp.APPEND: TorchAppend,
    TorchOp.MULTI_GET: TorchMultiGet,
    TorchOp.MULTI_SET: _multi_set,
    TorchOp.CANCEL_WAIT: TorchCancelWait,
    TorchOp.PING: TorchPing,
    TorchOp.QUEUE_PUSH: TorchQueuePush,
    TorchOp.QUEUE_POP: TorchQueuePop,
    TorchOp.QUEUE_LEN: TorchQueueLen,
    TorchOp.LIST_KEYS: TorchListKeys,
}
"""The request each :class:`TorchOp` builds from its decoded fields (in the codec's layout
order, keys already store keys)."""


def typed_decoder(
    *,
    max_key_size: int = DEFAULT_MAX_KEY_SIZE,
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> TorchDecoder[AnyTorchRequest]:
    """A decoder of a torch client's stream into these requests, keys as store keys."""
    return TorchDecoder(
        max_key_size=max_key_size,
        max_value_size=max_value_size,
        max_keys=max_keys,
        build=CLASSES,
        store_keys=True,
    )


def _store_field(code: str, field: TorchField) -> TorchField:
    if code == "k":
        assert isinstance(field, str)
        return store_key(field)
    if code == "K":
        return [store_key(key) for key in cast(list[str], field)]
    if code == "P":
        return [(store_key(key), value) for key, value in cast(list[tuple[str, bytes]], field)]
    return field


def typed_request(request: TorchRequest) -> AnyTorchRequest:
    """The typed request of an untyped one (its keys as torch's client sends them)."""
    layout = REQUEST_LAYOUT[request.op]
    fields = [_store_field(code, field) for code, field in zip(layout, request.fields, strict=True)]
    return CLASSES[request.op](*fields)
