"""The TCP store wire protocol, as pure functions: no sockets, no clock, no event loop.

Theory of operation. A client opens with the :data:`PREAMBLE` and its protocol version (two
bytes, big-endian), then speaks in frames. A frame is a 4-byte big-endian body length and a
body; the body is a 1-byte kind (an :class:`Op` from the client, a :class:`Status` from the
server), a 4-byte request id and the kind's fields, laid out as its entry in
:data:`REQUEST_FIELDS` or :data:`REPLY_FIELDS` says. The first frame is :attr:`Op.HELLO`
carrying the client's nonce (empty if it has no token). A server without a token answers
:attr:`Status.WELCOME` with its epoch (a number that changes when the server restarts), the
largest frame it accepts and an empty proof. A server with a token answers
:attr:`Status.CHALLENGE` with its own nonce, the client sends :attr:`Op.AUTH` with its proof,
and the server's ``WELCOME`` carries the server's proof (:mod:`._auth` says how proofs are
made). Either may instead answer :attr:`Status.REFUSED` and close; ``REFUSED`` keeps its code
and layout across versions, so a client of another version can read why. Replies
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
import functools
import struct
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, TypeVar

from aioelastic.store._errors import StoreProtocolError

PREAMBLE = b"AIOESTORE"
"""The first bytes a client sends, so a server can tell a stray client from its own."""

VERSION = 3
"""The protocol version this module speaks (2 added :attr:`Op.TTL_REMAINING`; 3 replaced the
token sent in ``HELLO`` with a challenge-response that never sends it)."""

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
"""The largest frame body accepted by default, in bytes."""

Field = str | bytes | int | float | bool | None | list[str] | list[bytes]
K = TypeVar("K", "Op", "Status")

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_HEADER = struct.Struct(">IBI")  # body length, kind, request id
_BODY_HEADER = struct.Struct(">BI")  # kind, request id
_VERSION = struct.Struct(">H")
_BODY_HEADER_SIZE = 5
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
    AUTH = 17


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
    CHALLENGE = 8
    TIMEOUT = 16
    VALUE_ERROR = 17
    INVALID = 18
    BAD_REQUEST = 19
    REFUSED = 20
    CLOSED = 21


REQUEST_FIELDS: dict[Op, str] = {
    Op.HELLO: "b",  # client nonce (empty without a token)
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
    Op.AUTH: "b",  # client proof
}
"""The fields of each request, by :class:`Op`."""

REPLY_FIELDS: dict[Status, str] = {
    Status.OK: "",
    Status.BYTES: "b",
    Status.INT: "n",
    Status.BOOL: "?",
    Status.VALUES: "B",
    Status.SNAPSHOT: "iSB",  # revision, keys, values
    Status.WELCOME: "iib",  # server epoch, server's max frame size, server proof (or empty)
    Status.SECONDS: "F",  # seconds, or None
    Status.CHALLENGE: "b",  # server nonce
    Status.TIMEOUT: "Sf",  # keys, timeout
    Status.VALUE_ERROR: "s",  # message
    Status.INVALID: "s",
    Status.BAD_REQUEST: "s",
    Status.REFUSED: "s",
    Status.CLOSED: "s",
}
"""The fields of each reply, by :class:`Status`."""


class Request(NamedTuple):
    """A decoded request frame (a named tuple: cheap to build on the hot path)."""

    op: Op
    request_id: int
    fields: tuple[Field, ...] = ()


class Reply(NamedTuple):
    """A decoded reply frame."""

    status: Status
    request_id: int
    fields: tuple[Field, ...] = ()


# -- encoding ----------------------------------------------------------------------------------
#
# Each layout is compiled once, at import, into a straight-line encoder (and, below, a
# straight-line decoder) by :func:`_compile`, as ``namedtuple`` and ``dataclasses`` compile
# theirs: a call per field and a list append per piece cost a third of a request's time.
# Decoding has a plain reader per field code as well, which is the reference: it names what is
# wrong with a malformed frame, and the compiled decoder hands it any frame it does not accept.

Reader = Callable[[bytes, int], tuple[Any, int]]
Encoder = Callable[..., bytes]


def _str_list(values: list[str]) -> bytes:
    parts = [_U32.pack(len(values))]
    for value in values:
        data = value.encode()
        parts += (_U32.pack(len(data)), data)
    return b"".join(parts)


def _bytes_list(values: list[bytes]) -> bytes:
    parts = [_U32.pack(len(values))]
    for value in values:
        parts += (_U32.pack(len(value)), value)
    return b"".join(parts)


_ENCODE_FIELD = {
    # code: (statements making piece(s) of field {f}, pieces, size of the pieces)
    "s": ("d{i} = {f}.encode()", "_u32(len(d{i})), d{i}", "4 + len(d{i})"),
    "b": ("", "_u32(len({f})), {f}", "4 + len({f})"),
    "n": ('d{i} = b"%d" % {f}', "_u32(len(d{i})), d{i}", "4 + len(d{i})"),
    "i": ("", "_i64({f})", "8"),
    "f": ("", "_f64({f})", "8"),
    "F": ('d{i} = b"\\x00" if {f} is None else b"\\x01" + _f64({f})', "d{i}", "len(d{i})"),
    "?": ('d{i} = b"\\x01" if {f} else b"\\x00"', "d{i}", "1"),
    "S": ("d{i} = _str_list({f})", "d{i}", "len(d{i})"),
    "B": ("d{i} = _bytes_list({f})", "d{i}", "len(d{i})"),
}
"""How the compiled encoder writes each field code."""

_DECODE_FIELD = {
    # code: statements reading field {i} at ``pos`` (raising _Slow where the reader would
    # raise, or might: the reference reader then says why)
    "s": (
        "e = pos + 4 + _u32_at(body, pos)[0]\n"
        "if e > size: raise _Slow\n"
        "v{i} = body[pos + 4 : e].decode()\n"
        "pos = e"
    ),
    "b": (
        "e = pos + 4 + _u32_at(body, pos)[0]\n"
        "if e > size: raise _Slow\n"
        "v{i} = body[pos + 4 : e]\n"
        "pos = e"
    ),
    "n": (
        "e = pos + 4 + _u32_at(body, pos)[0]\n"
        "if e > size or e - pos - 4 > _MAX_DIGITS: raise _Slow\n"
        "v{i} = body[pos + 4 : e]\n"
        "if not (v{i}[1:] if v{i}[:1] == b'-' else v{i}).isdigit(): raise _Slow\n"
        "v{i} = int(v{i})\n"
        "pos = e"
    ),
    "i": "v{i} = _i64_at(body, pos)[0]\npos += 8",
    "f": "v{i} = _f64_at(body, pos)[0]\npos += 8",
    "F": (
        "if pos >= size or body[pos] > 1: raise _Slow\n"
        "if body[pos]:\n"
        "    v{i} = _f64_at(body, pos + 1)[0]\n"
        "    pos += 9\n"
        "else:\n"
        "    v{i} = None\n"
        "    pos += 1"
    ),
    "?": "if pos >= size or body[pos] > 1: raise _Slow\nv{i} = body[pos] == 1\npos += 1",
    "S": "v{i}, pos = _read_strs(body, pos)",
    "B": "v{i}, pos = _read_bytes_list(body, pos)",
}
"""How the compiled decoder reads each field code (struct errors, a bad UTF-8 string or a
malformed list also send the frame to the reference readers)."""


class _Slow(Exception):
    """Raised by a compiled decoder for a frame it leaves to the reference readers."""


def _compile(
    layout: str,
) -> tuple[
    Encoder, Callable[[bytes], list[Field]], Callable[[Callable[..., R]], Callable[[bytes], R]]
]:
    """Compile ``layout`` into ``encode(kind, request_id, *fields) -> frame``,
    ``decode(body) -> fields`` (the body's 5-byte header skipped) and
    ``reader(build) -> read(body) -> build(request_id, *fields)`` (no list in between)."""
    names = [f"f{i}" for i in range(len(layout))]
    statements, pieces, sizes = [], ["_header(size, kind, request_id)"], ["5"]
    for i, (code, name) in enumerate(zip(layout, names, strict=True)):
        statement, piece, size = (part.format(i=i, f=name) for part in _ENCODE_FIELD[code])
        if statement:
            statements.append(statement)
        pieces.append(piece)
        sizes.append(size)
    statements.append(f"size = {' + '.join(sizes)}")
    encoder_lines = [f"def encode(kind, request_id, {', '.join(names)}):".replace(", )", ")")]
    encoder_lines += [f"    {line}" for line in statements]
    encoder_lines.append(f"    return b''.join(({', '.join(pieces)},))")
    decoder_lines = ["def decode(body):", "    size = len(body)", "    pos = 5"]
    for i, code in enumerate(layout):
        decoder_lines += [f"    {line}" for line in _DECODE_FIELD[code].format(i=i).splitlines()]
    decoder_lines.append("    if pos != size: raise _Slow")
    fields = ", ".join(f"v{i}" for i in range(len(layout)))
    reader_lines = ["def reader(build):", *(f"    {line}" for line in decoder_lines)]
    reader_lines[1] = "    def read(body):"
    reader_lines.append(f"        return build(_u32_at(body, 1)[0], {fields})".replace(", )", ")"))
    reader_lines.append("    return read")
    decoder_lines.append(f"    return [{fields}]")
    namespace: dict[str, Any] = {
        "_header": _HEADER.pack,
        "_u32": _U32.pack,
        "_i64": _I64.pack,
        "_f64": _F64.pack,
        "_u32_at": _U32.unpack_from,
        "_i64_at": _I64.unpack_from,
        "_f64_at": _F64.unpack_from,
        "_str_list": _str_list,
        "_bytes_list": _bytes_list,
        "_read_strs": _list_reader(_read_str),
        "_read_bytes_list": _list_reader(_read_bytes),
        "_Slow": _Slow,
        "_MAX_DIGITS": _MAX_DIGITS,
    }
    source = "\n\n".join("\n".join(lines) for lines in (encoder_lines, decoder_lines, reader_lines))
    exec(source, namespace)
    return namespace["encode"], namespace["decode"], namespace["reader"]


def encode_preamble(version: int = VERSION) -> bytes:
    """The bytes a client sends first."""
    return PREAMBLE + _VERSION.pack(version)


def encode_request(op: Op, request_id: int, *fields: Field) -> bytes:
    """Return the frame (length prefix included) of a request."""
    return _encode(op, request_id, _REQUEST_CODECS[op], fields)


def encode_reply(status: Status, request_id: int, *fields: Field) -> bytes:
    """Return the frame (length prefix included) of a reply."""
    return _encode(status, request_id, _REPLY_CODECS[status], fields)


def reply_encoder(status: Status) -> Callable[..., bytes]:
    """``encode(request_id, *fields)`` for replies of ``status`` (no field count check)."""
    return partial(_REPLY_CODECS[status].encode, status)


def request_encoders() -> dict[Op, Callable[..., bytes]]:
    """``encode(request_id, *fields)`` for requests of each op (no field count check)."""
    return {op: partial(codec.encode, op) for op, codec in _REQUEST_CODECS.items()}


def _encode(kind: int, request_id: int, codec: _Codec, fields: tuple[Field, ...]) -> bytes:
    if len(fields) != codec.arity:
        raise ValueError(f"kind {kind} takes {codec.arity} fields, got {len(fields)}")
    return codec.encode(kind, request_id, *fields)


# -- decoding ----------------------------------------------------------------------------------


class _Malformed(Exception):
    """Raised by a reader; the decoder adds the request id and raises StoreProtocolError."""


def _take(body: bytes, pos: int, size: int, what: str) -> int:
    """Return the offset after ``size`` bytes at ``pos``, if the frame holds them."""
    end = pos + size
    if end > len(body):
        raise _Malformed(
            f"frame ends inside {what}: needs {size} bytes at offset {pos}, has {len(body) - pos}"
        )
    return end


def _read_sized(body: bytes, pos: int, what: str) -> tuple[bytes, int]:
    """Read a 4-byte length and that many bytes (the readers below inline this for speed)."""
    start = _take(body, pos, 4, f"{what} length")
    end = _take(body, start, _U32.unpack_from(body, pos)[0], what)
    return body[start:end], end


def _read_bytes(body: bytes, pos: int) -> tuple[bytes, int]:
    start = pos + 4
    end = start + _U32.unpack_from(body, pos)[0] if start <= len(body) else start
    if end > len(body):
        return _read_sized(body, pos, "a bytes value")  # raises, naming what is missing
    return body[start:end], end


def _read_str(body: bytes, pos: int) -> tuple[str, int]:
    start = pos + 4
    end = start + _U32.unpack_from(body, pos)[0] if start <= len(body) else start
    if end > len(body):
        _read_sized(body, pos, "a string")  # raises, naming what is missing
    try:
        return body[start:end].decode(), end
    except UnicodeDecodeError:
        raise _Malformed(f"a string is not valid UTF-8: {body[start:end][:40]!r}") from None


def _read_number(body: bytes, pos: int) -> tuple[int, int]:
    digits, end = _read_sized(body, pos, "an integer")
    unsigned = digits[1:] if digits[:1] == b"-" else digits
    if len(digits) > _MAX_DIGITS or not unsigned.isdigit():  # bytes.isdigit() is ASCII-only
        raise _Malformed(f"an integer is not ASCII decimal: {digits[:40]!r}")
    return int(digits), end


def _read_i64(body: bytes, pos: int) -> tuple[int, int]:
    end = _take(body, pos, 8, "a 64-bit integer")
    value: int = _I64.unpack_from(body, pos)[0]
    return value, end


def _read_f64(body: bytes, pos: int) -> tuple[float, int]:
    end = _take(body, pos, 8, "a float")
    value: float = _F64.unpack_from(body, pos)[0]
    return value, end


def _read_flag(body: bytes, pos: int, what: str) -> tuple[bool, int]:
    end = _take(body, pos, 1, what)
    flag = body[pos]
    if flag > 1:
        raise _Malformed(f"{what} has flag byte {flag}, not 0 or 1")
    return flag == 1, end


def _read_optional_f64(body: bytes, pos: int) -> tuple[float | None, int]:
    present, end = _read_flag(body, pos, "an optional float")
    return _read_f64(body, end) if present else (None, end)


def _read_bool(body: bytes, pos: int) -> tuple[bool, int]:
    return _read_flag(body, pos, "a boolean")


def _list_reader(read_item: Reader) -> Reader:
    def read(body: bytes, pos: int) -> tuple[list[Any], int]:
        end = _take(body, pos, 4, "a list length")
        count: int = _U32.unpack_from(body, pos)[0]
        # Every item takes at least 4 bytes, so a count the frame cannot hold is refused before
        # anything is allocated for it.
        if count * 4 > len(body) - end:
            raise _Malformed(f"a list claims {count} items, more than the frame can hold")
        items = []
        for _ in range(count):
            item, end = read_item(body, end)
            items.append(item)
        return items, end

    return read


_READERS: dict[str, Reader] = {
    "s": _read_str,
    "b": _read_bytes,
    "n": _read_number,
    "i": _read_i64,
    "f": _read_f64,
    "F": _read_optional_f64,
    "?": _read_bool,
    "S": _list_reader(_read_str),
    "B": _list_reader(_read_bytes),
}
"""Each field code's reference reader."""


class _Codec(NamedTuple):
    """One kind's layout, compiled (see :func:`_compile`), and its reference readers."""

    arity: int
    encode: Encoder
    decode: Callable[[bytes], list[Field]]
    reader: Callable[[Callable[..., Any]], Callable[[bytes], Any]]
    readers: tuple[Reader, ...]


@functools.cache
def _codec(layout: str) -> _Codec:
    encode, decode, reader = _compile(layout)
    return _Codec(len(layout), encode, decode, reader, tuple(_READERS[code] for code in layout))


_REQUEST_CODECS = {op: _codec(layout) for op, layout in REQUEST_FIELDS.items()}
_REPLY_CODECS = {status: _codec(layout) for status, layout in REPLY_FIELDS.items()}
_REQUEST_KINDS = {op.value: (op, _REQUEST_CODECS[op]) for op in Op}
_REPLY_KINDS = {status.value: (status, _REPLY_CODECS[status]) for status in Status}


def decode_request(body: bytes) -> Request:
    """Decode a request frame body (without its length prefix)."""
    op, request_id, fields = decode_request_fields(body)
    return Request(op, request_id, tuple(fields))


def decode_request_fields(body: bytes) -> tuple[Op, int, list[Field]]:
    """Decode a request frame body into its op, request id and fields (for typed requests)."""
    return _decode(body, _REQUEST_KINDS, "operation")


R = TypeVar("R")


def request_reader(classes: dict[Op, Callable[..., R]]) -> Callable[[bytes], R]:
    """``read(body) -> classes[op](request_id, *fields)``: :func:`decode_request_fields` and
    the construction in one step (the server's per-request path: no tuple or list in between),
    with the same errors for a bad frame."""
    table: dict[int, Callable[[bytes], R]] = {
        op.value: _REQUEST_CODECS[op].reader(build) for op, build in classes.items()
    }

    def read(body: bytes) -> R:
        try:
            return table[body[0]](body)
        except (*_SLOW_PATH, IndexError):
            op, request_id, fields = _decode_slowly(body, _REQUEST_KINDS, "operation")
            return classes[op](request_id, *fields)

    return read


def decode_reply(body: bytes) -> Reply:
    """Decode a reply frame body (without its length prefix)."""
    try:  # (as _decode, inline: every call of a client comes through here)
        code, request_id = _BODY_HEADER.unpack_from(body)
        status, codec = _REPLY_KINDS[code]
        fields = codec.decode(body)
    except _SLOW_PATH:
        status, request_id, fields = _decode_slowly(body, _REPLY_KINDS, "reply status")
    return _new_tuple(Reply, (status, request_id, tuple(fields)))  # (Reply() is a Python frame)


_new_tuple = tuple.__new__


_SLOW_PATH = (_Slow, struct.error, UnicodeDecodeError, _Malformed, KeyError)
"""What sends a frame from the compiled decoder to the reference readers."""


def _decode(
    body: bytes, kinds: dict[int, tuple[K, _Codec]], what: str
) -> tuple[K, int, list[Field]]:
    try:
        code, request_id = _BODY_HEADER.unpack_from(body)
        kind, codec = kinds[code]
        return kind, request_id, codec.decode(body)
    except _SLOW_PATH:
        return _decode_slowly(body, kinds, what)


def _decode_slowly(
    body: bytes, kinds: dict[int, tuple[K, _Codec]], what: str
) -> tuple[K, int, list[Field]]:
    """Decode with the reference readers, raising StoreProtocolError that says what is wrong."""
    if len(body) < _BODY_HEADER_SIZE:
        raise StoreProtocolError(
            f"a frame body of {len(body)} bytes is shorter than its {_BODY_HEADER_SIZE}-byte header"
        )
    code, request_id = _BODY_HEADER.unpack_from(body)
    entry = kinds.get(code)
    if entry is None:
        raise StoreProtocolError(f"unknown {what} {code}", request_id)
    kind, codec = entry
    pos = _BODY_HEADER_SIZE
    fields: list[Field] = []
    try:
        for read in codec.readers:
            value, pos = read(body, pos)
            fields.append(value)
    except _Malformed as error:
        raise StoreProtocolError(str(error), request_id) from None
    if pos != len(body):
        raise StoreProtocolError(
            f"{len(body) - pos} unexpected bytes after the last field", request_id
        )
    return kind, request_id, fields


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


class FrameTooLargeError(StoreProtocolError):
    """A frame declared a body above the reader's ``max_frame_size``."""


class FrameReader:
    """Splits a byte stream into frame bodies, refusing any frame above ``max_frame_size``."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the bodies of the frames now complete, in order.

        Raises :class:`StoreProtocolError` when a frame declares a body larger than the limit
        (the stream cannot be trusted after that: close it); the error names the frame's
        request id when its header has arrived.
        """
        buffer = self._buffer
        whole = len(data) - 4
        if not buffer and 0 < whole <= self.max_frame_size and whole == _U32.unpack_from(data)[0]:
            return [data[4:]]  # the usual case: exactly one frame
        # Usually the buffer is empty and ``data`` holds whole frames: split it without a copy.
        source: bytes | bytearray = data
        if buffer:
            buffer += data
            source = buffer
        bodies: list[bytes] = []
        start = 0
        end = len(source)
        while end - start >= 4:
            size: int = _U32.unpack_from(source, start)[0]
            if size > self.max_frame_size:
                # Name the request when its id has arrived, so only that request fails.
                known = end - start >= 4 + _BODY_HEADER_SIZE
                raise FrameTooLargeError(
                    f"a frame of {size} bytes exceeds the maximum of {self.max_frame_size}; "
                    "split large values or raise max_frame_size on both ends",
                    _U32.unpack_from(source, start + 5)[0] if known else None,
                )
            if end - start - 4 < size:
                break
            bodies.append(bytes(source[start + 4 : start + 4 + size]))
            start += 4 + size
        if source is buffer:
            del buffer[:start]
        elif start < end:
            buffer += data[start:]
        return bodies

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)
