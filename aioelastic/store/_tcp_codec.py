"""The TCP store wire protocol, as pure functions: no sockets, no clock, no event loop.

Theory of operation. A client opens with the :data:`PREAMBLE` and its protocol version (two
bytes, big-endian), then speaks in frames. A frame is a 4-byte big-endian body length and a
body; the body is a 1-byte kind (an :class:`Op` from the client, a :class:`Status` from the
server), a 4-byte request id and the kind's fields, laid out as its entry in
:data:`REQUEST_FIELDS` or :data:`REPLY_FIELDS` says. The first frame is :attr:`Op.HELLO`
carrying the token (empty if none); the server answers :attr:`Status.WELCOME` with its epoch
(a number that changes when the server restarts) and the largest frame it accepts, or
:attr:`Status.REFUSED` and closes. Replies
carry the id of their request and may come in any order, so one connection carries many
concurrent requests. :attr:`Op.CANCEL` withdraws a waiting request (its id is the frame's id)
and gets no reply.

Field codes: ``s`` str (UTF-8) and ``b`` bytes, each a 4-byte length then the bytes; ``n`` an
integer of any size (length-prefixed ASCII decimal); ``i`` a signed 64-bit integer; ``f`` a
64-bit float; ``F`` an optional float (a presence byte, then the float if present); ``?`` a
byte 0 or 1; ``S`` and ``B`` lists of str and bytes (a 4-byte count, then the items).

Any bytes that do not decode raise :class:`StoreProtocolError` naming what was wrong; the
reader never crashes and never allocates more than the frame's declared length.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from aioelastic.store._errors import StoreProtocolError

PREAMBLE = b"AIOESTORE"
"""The first bytes a client sends, so a server can tell a stray client from its own."""

VERSION = 2
"""The protocol version this module speaks (2 added :attr:`Op.TTL_REMAINING`)."""

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
"""The largest frame body accepted by default, in bytes."""

Field = str | bytes | int | float | bool | None | list[str] | list[bytes]
K = TypeVar("K", "Op", "Status")

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_HEADER = struct.Struct(">IBI")  # body length, kind, request id
_VERSION = struct.Struct(">H")
_BODY_HEADER_SIZE = 5
_DECIMAL = re.compile(rb"-?[0-9]+")
_MAX_DIGITS = 4300  # Python's own limit for int(str)


class Op(enum.IntEnum):
    """What a client asks for."""

    HELLO = 1
    SET = 2
    GET = 3
    ADD = 4
    COMPARE_SET = 5
    WAIT = 6
    CHECK = 7
    DELETE_KEY = 8
    NUM_KEYS = 9
    MULTI_GET = 10
    MULTI_SET = 11
    APPEND = 12
    GET_PREFIX = 13
    WAIT_FOR_CHANGE = 14
    CANCEL = 15
    TTL_REMAINING = 16


class Status(enum.IntEnum):
    """What a reply carries: a result (below 16) or an error (16 and up)."""

    OK = 0
    BYTES = 1
    INT = 2
    BOOL = 3
    VALUES = 4
    SNAPSHOT = 5
    WELCOME = 6
    SECONDS = 7
    TIMEOUT = 16
    VALUE_ERROR = 17
    INVALID = 18
    BAD_REQUEST = 19
    REFUSED = 20
    CLOSED = 21


REQUEST_FIELDS: dict[Op, str] = {
    Op.HELLO: "b",  # token
    Op.SET: "sbF",  # key, value, ttl
    Op.GET: "sf",  # key, timeout
    Op.ADD: "sn",  # key, amount
    Op.COMPARE_SET: "sbb",  # key, expected, desired
    Op.WAIT: "Sf",  # keys, timeout
    Op.CHECK: "S",  # keys
    Op.DELETE_KEY: "s",  # key
    Op.NUM_KEYS: "",
    Op.MULTI_GET: "Sf",  # keys, timeout
    Op.MULTI_SET: "SB",  # keys, values
    Op.APPEND: "sb",  # key, value
    Op.GET_PREFIX: "s",  # prefix
    Op.WAIT_FOR_CHANGE: "sif",  # prefix, after, timeout
    Op.CANCEL: "",
    Op.TTL_REMAINING: "s",  # key
}
"""The fields of each request, by :class:`Op`."""

REPLY_FIELDS: dict[Status, str] = {
    Status.OK: "",
    Status.BYTES: "b",
    Status.INT: "n",
    Status.BOOL: "?",
    Status.VALUES: "B",
    Status.SNAPSHOT: "iSB",  # revision, keys, values
    Status.WELCOME: "ii",  # server epoch, server's max frame size
    Status.SECONDS: "F",  # seconds, or None
    Status.TIMEOUT: "Sf",  # keys, timeout
    Status.VALUE_ERROR: "s",  # message
    Status.INVALID: "s",
    Status.BAD_REQUEST: "s",
    Status.REFUSED: "s",
    Status.CLOSED: "s",
}
"""The fields of each reply, by :class:`Status`."""


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request frame."""

    op: Op
    request_id: int
    fields: tuple[Field, ...] = ()


@dataclass(frozen=True, slots=True)
class Reply:
    """A decoded reply frame."""

    status: Status
    request_id: int
    fields: tuple[Field, ...] = ()


# -- encoding ----------------------------------------------------------------------------------


def _encode_field(code: str, value: Field, out: list[bytes]) -> None:
    if code == "s":
        assert isinstance(value, str)
        data = value.encode()
        out += (_U32.pack(len(data)), data)
    elif code == "b":
        assert isinstance(value, bytes)
        out += (_U32.pack(len(value)), value)
    elif code == "n":
        assert isinstance(value, int)
        digits = str(value).encode()
        out += (_U32.pack(len(digits)), digits)
    elif code == "i":
        assert isinstance(value, int)
        out.append(_I64.pack(value))
    elif code == "f":
        assert isinstance(value, float | int)
        out.append(_F64.pack(value))
    elif code == "F":
        if value is None:
            out.append(b"\x00")
        else:
            assert isinstance(value, float | int)
            out.append(b"\x01" + _F64.pack(value))
    elif code == "?":
        out.append(b"\x01" if value else b"\x00")
    else:
        assert isinstance(value, list)
        out.append(_U32.pack(len(value)))
        item_code = code.lower()
        for item in value:
            _encode_field(item_code, item, out)


def _encode(kind: int, request_id: int, layout: str, fields: Sequence[Field]) -> bytes:
    if len(fields) != len(layout):
        raise ValueError(f"kind {kind} takes {len(layout)} fields, got {len(fields)}")
    out: list[bytes] = [b""]
    for code, value in zip(layout, fields, strict=True):
        _encode_field(code, value, out)
    size = sum(map(len, out)) + _BODY_HEADER_SIZE
    out[0] = _HEADER.pack(size, kind, request_id)
    return b"".join(out)


def encode_preamble(version: int = VERSION) -> bytes:
    """The bytes a client sends first."""
    return PREAMBLE + _VERSION.pack(version)


def encode_request(op: Op, request_id: int, *fields: Field) -> bytes:
    """Return the frame (length prefix included) of a request."""
    return _encode(op, request_id, REQUEST_FIELDS[op], fields)


def encode_reply(status: Status, request_id: int, *fields: Field) -> bytes:
    """Return the frame (length prefix included) of a reply."""
    return _encode(status, request_id, REPLY_FIELDS[status], fields)


# -- decoding ----------------------------------------------------------------------------------


class _Cursor:
    """Reads fields from one frame body, raising :class:`StoreProtocolError` on short data."""

    __slots__ = ("body", "pos", "request_id")

    def __init__(self, body: bytes, request_id: int) -> None:
        self.body = body
        self.pos = _BODY_HEADER_SIZE
        self.request_id = request_id

    def fail(self, reason: str) -> StoreProtocolError:
        return StoreProtocolError(reason, self.request_id)

    def take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if end > len(self.body):
            raise self.fail(
                f"frame ends inside {what}: needs {size} bytes at offset {self.pos}, "
                f"has {len(self.body) - self.pos}"
            )
        data = self.body[self.pos : end]
        self.pos = end
        return data

    def u32(self, what: str) -> int:
        value: int = _U32.unpack(self.take(4, what))[0]
        return value

    def field(self, code: str) -> Field:
        if code == "s":
            data = self.take(self.u32("a string length"), "a string")
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise self.fail(f"a string is not valid UTF-8: {data[:40]!r}") from None
        if code == "b":
            return self.take(self.u32("a bytes length"), "a bytes value")
        if code == "n":
            digits = self.take(self.u32("an integer length"), "an integer")
            if len(digits) > _MAX_DIGITS or not _DECIMAL.fullmatch(digits):
                raise self.fail(f"an integer is not ASCII decimal: {digits[:40]!r}")
            return int(digits)
        if code == "i":
            value: int = _I64.unpack(self.take(8, "a 64-bit integer"))[0]
            return value
        if code == "f":
            number: float = _F64.unpack(self.take(8, "a float"))[0]
            return number
        if code == "F":
            flag = self.take(1, "an optional float")[0]
            if flag > 1:
                raise self.fail(f"an optional float has presence byte {flag}, not 0 or 1")
            return self.field("f") if flag else None
        if code == "?":
            flag = self.take(1, "a boolean")[0]
            if flag > 1:
                raise self.fail(f"a boolean is {flag}, not 0 or 1")
            return bool(flag)
        count = self.u32("a list length")
        # Every item takes at least 4 bytes, so a count the frame cannot hold is refused before
        # anything is allocated for it.
        if count * 4 > len(self.body) - self.pos:
            raise self.fail(f"a list claims {count} items, more than the frame can hold")
        item_code = code.lower()
        items = [self.field(item_code) for _ in range(count)]
        return items  # type: ignore[return-value]

    def fields(self, layout: str) -> tuple[Field, ...]:
        values = tuple(self.field(code) for code in layout)
        if self.pos != len(self.body):
            raise self.fail(f"{len(self.body) - self.pos} unexpected bytes after the last field")
        return values


def _header(body: bytes) -> tuple[int, int]:
    if len(body) < _BODY_HEADER_SIZE:
        raise StoreProtocolError(
            f"a frame body of {len(body)} bytes is shorter than its {_BODY_HEADER_SIZE}-byte header"
        )
    kind = body[0]
    request_id: int = _U32.unpack_from(body, 1)[0]
    return kind, request_id


def decode_request(body: bytes) -> Request:
    """Decode a request frame body (without its length prefix)."""
    op, request_id, fields = _decode(body, Op, REQUEST_FIELDS, "operation")
    return Request(op, request_id, fields)


def decode_reply(body: bytes) -> Reply:
    """Decode a reply frame body (without its length prefix)."""
    status, request_id, fields = _decode(body, Status, REPLY_FIELDS, "reply status")
    return Reply(status, request_id, fields)


def _decode(
    body: bytes, kinds: type[K], layouts: dict[K, str], what: str
) -> tuple[K, int, tuple[Field, ...]]:
    code, request_id = _header(body)
    try:
        kind = kinds(code)
    except ValueError:
        raise StoreProtocolError(f"unknown {what} {code}", request_id) from None
    return kind, request_id, _Cursor(body, request_id).fields(layouts[kind])


def decode_preamble(data: bytes) -> int:
    """Return the protocol version announced by a client's first bytes."""
    size = len(PREAMBLE) + _VERSION.size
    if len(data) != size or not data.startswith(PREAMBLE):
        raise StoreProtocolError(
            f"not an aioelastic store client: first bytes {data[:size]!r}, "
            f"expected {PREAMBLE!r} and a version"
        )
    version: int = _VERSION.unpack_from(data, len(PREAMBLE))[0]
    return version


PREAMBLE_SIZE = len(PREAMBLE) + _VERSION.size
"""How many bytes :func:`decode_preamble` reads."""


class FrameReader:
    """Splits a byte stream into frame bodies, refusing any frame above ``max_frame_size``."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the bodies of the frames now complete, in order.

        Raises :class:`StoreProtocolError` when a frame declares a body larger than the limit
        (the stream cannot be trusted after that: close it).
        """
        buffer = self._buffer
        buffer += data
        bodies: list[bytes] = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            size: int = _U32.unpack_from(buffer, start)[0]
            if size > self.max_frame_size:
                raise StoreProtocolError(
                    f"a frame of {size} bytes exceeds the maximum of {self.max_frame_size}; "
                    "split large values or raise max_frame_size on both ends"
                )
            if end - start - 4 < size:
                break
            bodies.append(bytes(buffer[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return bodies

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)
