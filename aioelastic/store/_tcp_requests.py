"""The TCP store's requests as typed values, one class per :class:`Op` (as h11's events).

:func:`read_request` decodes a frame body into one of them; its fields are named and typed,
in the order of the op's layout in :data:`~._tcp_codec.REQUEST_FIELDS`, so code that handles a
request reads ``request.key`` instead of unpacking an untyped tuple. The server's dispatch
table (:mod:`._tcp_session`) is keyed by these classes. They are plain slotted dataclasses,
not frozen ones (treat them as read-only): a frozen one costs twice as much to build, about
0.7 us of a request's 3-4 us of Python on the server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from aioelastic.store._tcp_codec import Op, request_reader


@dataclass(slots=True)
class Hello:
    op: ClassVar[Op] = Op.HELLO
    request_id: int
    nonce: bytes
    """The client's nonce, empty if it has no token."""


@dataclass(slots=True)
class Auth:
    op: ClassVar[Op] = Op.AUTH
    request_id: int
    proof: bytes


@dataclass(slots=True)
class Set:
    op: ClassVar[Op] = Op.SET
    request_id: int
    key: str
    value: bytes
    ttl: float | None


@dataclass(slots=True)
class Get:
    op: ClassVar[Op] = Op.GET
    request_id: int
    key: str
    timeout: float


@dataclass(slots=True)
class Add:
    op: ClassVar[Op] = Op.ADD
    request_id: int
    key: str
    amount: int


@dataclass(slots=True)
class CompareSet:
    op: ClassVar[Op] = Op.COMPARE_SET
    request_id: int
    key: str
    expected: bytes
    desired: bytes


@dataclass(slots=True)
class Wait:
    op: ClassVar[Op] = Op.WAIT
    request_id: int
    keys: list[str]
    timeout: float


@dataclass(slots=True)
class Check:
    op: ClassVar[Op] = Op.CHECK
    request_id: int
    keys: list[str]


@dataclass(slots=True)
class DeleteKey:
    op: ClassVar[Op] = Op.DELETE_KEY
    request_id: int
    key: str


@dataclass(slots=True)
class NumKeys:
    op: ClassVar[Op] = Op.NUM_KEYS
    request_id: int


@dataclass(slots=True)
class MultiGet:
    op: ClassVar[Op] = Op.MULTI_GET
    request_id: int
    keys: list[str]
    timeout: float


@dataclass(slots=True)
class MultiSet:
    op: ClassVar[Op] = Op.MULTI_SET
    request_id: int
    keys: list[str]
    values: list[bytes]


@dataclass(slots=True)
class Append:
    op: ClassVar[Op] = Op.APPEND
    request_id: int
    key: str
    value: bytes


@dataclass(slots=True)
class GetPrefix:
    op: ClassVar[Op] = Op.GET_PREFIX
    request_id: int
    prefix: str


@dataclass(slots=True)
class WaitForChange:
    op: ClassVar[Op] = Op.WAIT_FOR_CHANGE
    request_id: int
    prefix: str
    after: int
    timeout: float


@dataclass(slots=True)
class Cancel:
    """Withdraws the waiting request whose id this one carries (no reply)."""

    op: ClassVar[Op] = Op.CANCEL
    request_id: int


@dataclass(slots=True)
class TtlRemaining:
    op: ClassVar[Op] = Op.TTL_REMAINING
    request_id: int
    key: str


AnyRequest = (
    Hello
    | Auth
    | Set
    | Get
    | Add
    | CompareSet
    | Wait
    | Check
    | DeleteKey
    | NumKeys
    | MultiGet
    | MultiSet
    | Append
    | GetPrefix
    | WaitForChange
    | Cancel
    | TtlRemaining
)

WaitRequest = Get | MultiGet | Wait | WaitForChange
"""The requests that may have to wait server-side (each carries a ``timeout``)."""

REQUEST_TYPES: dict[Op, type[AnyRequest]] = {
    cls.op: cls
    for cls in (
        Hello,
        Auth,
        Set,
        Get,
        Add,
        CompareSet,
        Wait,
        Check,
        DeleteKey,
        NumKeys,
        MultiGet,
        MultiSet,
        Append,
        GetPrefix,
        WaitForChange,
        Cancel,
        TtlRemaining,
    )
}
"""The request class of each :class:`Op`."""


read_request: Callable[[bytes], AnyRequest] = request_reader(dict(REQUEST_TYPES))
"""Decode a request frame body (without its length prefix) into its typed request.

Raises :class:`~aioelastic.store.StoreProtocolError` as :func:`~._tcp_codec.decode_request`
does (a reader, not a function around one: this is every request's first step on the server).
"""
