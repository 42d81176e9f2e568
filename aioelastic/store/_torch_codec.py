"""Torch's c10d ``TCPStore`` wire protocol, as pure functions: no sockets, no clock, no loop.

Theory of operation (as torch 2.13's client sends it, checked byte for byte against it). There
are no frames and no request ids: a request is a one-byte :class:`TorchOp` followed by the
op's fields, laid out as its entry in :data:`REQUEST_LAYOUT` says; replies come back in request
order, and several ops (set, append, multi-set, queue push, validate) get none. Integers are
in the host's byte order, which is little-endian on every platform torch ships for; this
module speaks little-endian. A connection opens with ``VALIDATE`` (a 32-bit magic number) and
then a ``PING`` whose nonce the server echoes. A client's ``get`` is a ``WAIT`` on the key then
a ``GET``; a wait that times out client-side is followed by ``CANCEL_WAIT``, which the server
always answers with :data:`WAIT_CANCELED` (after a :data:`STOP_WAITING` if the wait had already
been answered).

Field codes: ``k`` a key (64-bit length, then UTF-8), ``v`` a value (64-bit length, then
bytes), ``q`` a signed 64-bit integer, ``u`` an unsigned 32-bit integer, ``K`` a list of keys
(64-bit count, then each key), ``P`` a list of key/value pairs (64-bit count, then each pair).

:class:`TorchDecoder` is incremental: feed it any split of the stream. Bytes that cannot be a
request raise :class:`TorchProtocolError` naming what was wrong; it never allocates more than
the limits it was given, whatever length a peer declares.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar, overload

from aioelastic.store._errors import StoreProtocolError

VALIDATION_MAGIC = 0x3C85F7CE
"""The number a torch client's first request (``VALIDATE``) carries."""

STOP_WAITING = b"\x00"
"""The reply to a ``WAIT`` once every key exists."""

WAIT_CANCELED = b"\x01"
"""The reply to ``CANCEL_WAIT``."""

CHECK_READY = b"\x00"
CHECK_NOT_READY = b"\x01"

DEFAULT_MAX_KEY_SIZE = 64 * 1024
"""The longest key accepted by default, in bytes (torch's own server accepts 8 KiB)."""

DEFAULT_MAX_VALUE_SIZE = 16 * 1024 * 1024
"""The largest value accepted by default, in bytes (our native frame limit)."""

DEFAULT_MAX_KEYS = 128 * 1024
"""The most keys one request may name (torch's own server's limit)."""

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_I64_RANGE = range(-(2**63), 2**63)


class TorchOp(enum.IntEnum):
    """What a torch client asks for (torch's ``QueryType``)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17


REQUEST_LAYOUT: dict[TorchOp, str] = {
    TorchOp.VALIDATE: "u",  # magic
    TorchOp.SET: "kv",  # key, value
    TorchOp.COMPARE_SET: "kvv",  # key, expected, desired
    TorchOp.GET: "k",
    TorchOp.ADD: "kq",  # key, amount
    TorchOp.CHECK: "K",
    TorchOp.WAIT: "K",
    TorchOp.GETNUMKEYS: "",
    TorchOp.DELETE_KEY: "k",
    TorchOp.APPEND: "kv",
    TorchOp.MULTI_GET: "K",
    TorchOp.MULTI_SET: "P",
    TorchOp.CANCEL_WAIT: "",
    TorchOp.PING: "u",  # nonce
    TorchOp.QUEUE_PUSH: "kv",
    TorchOp.QUEUE_POP: "k",
    TorchOp.QUEUE_LEN: "k",
    TorchOp.LIST_KEYS: "",
}
"""The fields of each request, by :class:`TorchOp`."""

TorchField = str | bytes | int | list[str] | list[tuple[str, bytes]]


class TorchRequest(NamedTuple):
    """One decoded request."""

    op: TorchOp
    fields: tuple[TorchField, ...] = ()


class TorchProtocolError(StoreProtocolError):
    """Bytes from a torch client that cannot be a request (the stream cannot be trusted)."""


def looks_like_torch(first: bytes) -> bool:
    """Return whether a connection's first bytes are a torch client's (``VALIDATE`` leads)."""
    return first[:1] == b"\x00"


class _Incomplete(Exception):
    """The request is not all here yet; ``need`` is the buffer length worth waiting for."""

    def __init__(self, need: int) -> None:
        self.need = need


class _Slow(Exception):
    """Raised by a compiled reader for a request it leaves to the reference parser."""


_SLOW_PATH = (_Slow, struct.error, UnicodeDecodeError)
"""What sends a request from its compiled reader to the reference parser (which then says
what is wrong, or that the request is not all here yet)."""

R = TypeVar("R")

FastReader = Callable[[bytes, int], tuple[Any, int]]
"""``read(data, offset after the op byte) -> (request, offset after it)``."""

# Each layout is compiled once, at import, into a straight-line reader (as the native codec
# compiles its layouts): a method call per field cost half of a request's Python on the
# server. The reference parser (:meth:`TorchDecoder._parse`) stays: it takes every request the
# compiled reader does not accept (not all here, above a limit, not UTF-8) and says why.
_READ_FIELD = {
    # code: statements reading field {i} at ``pos`` (raising _Slow where the reference parser
    # would raise or wait for more)
    "k": (
        "n = _u64_at(data, pos)[0]\n"
        "s = pos + 8\n"
        "pos = s + n\n"
        "if n > max_key or pos > size: raise _Slow\n"
        "if strip and n and data[s] == 47: s += 1\n"
        "v{i} = data[s:pos].decode()"
    ),
    "v": (
        "n = _u64_at(data, pos)[0]\n"
        "s = pos + 8\n"
        "pos = s + n\n"
        "if n > max_value or pos > size: raise _Slow\n"
        "v{i} = data[s:pos]"
    ),
    "q": "v{i} = _i64_at(data, pos)[0]\npos += 8",
    "u": "v{i} = _u32_at(data, pos)[0]\npos += 4",
    "K": "v{i}, pos = _keys(data, pos, size, max_key, max_keys, strip)",
    "P": "v{i}, pos = _pairs(data, pos, size, max_key, max_value, max_keys, strip)",
}


def _read_key(data: bytes, pos: int, size: int, max_key: int, strip: bool) -> tuple[str, int]:
    n: int = _U64.unpack_from(data, pos)[0]
    s = pos + 8
    pos = s + n
    if n > max_key or pos > size:
        raise _Slow
    if strip and n and data[s] == 47:
        s += 1
    return data[s:pos].decode(), pos


def _keys(
    data: bytes, pos: int, size: int, max_key: int, max_keys: int, strip: bool
) -> tuple[list[str], int]:
    count: int = _U64.unpack_from(data, pos)[0]
    if count > max_keys:
        raise _Slow
    pos += 8
    keys = []
    for _ in range(count):  # _read_key inlined: a WAIT of one key is half of a torch get
        n: int = _U64.unpack_from(data, pos)[0]
        s = pos + 8
        pos = s + n
        if n > max_key or pos > size:
            raise _Slow
        if strip and n and data[s] == 47:
            s += 1
        keys.append(data[s:pos].decode())
    return keys, pos


def _pairs(
    data: bytes, pos: int, size: int, max_key: int, max_value: int, max_keys: int, strip: bool
) -> tuple[list[tuple[str, bytes]], int]:
    count: int = _U64.unpack_from(data, pos)[0]
    if count > max_keys:
        raise _Slow
    pos += 8
    pairs = []
    for _ in range(count):
        key, pos = _read_key(data, pos, size, max_key, strip)
        n: int = _U64.unpack_from(data, pos)[0]
        s = pos + 8
        pos = s + n
        if n > max_value or pos > size:
            raise _Slow
        pairs.append((key, data[s:pos]))
    return pairs, pos


def _compile(layout: str) -> tuple[Callable[..., FastReader], Callable[..., FastReader]]:
    """Compile ``layout`` into ``make(build, max_key, max_value, max_keys, strip) -> read``,
    whose reader returns ``build(*fields)``, and the same for a ``build`` that is a named
    tuple class (built with ``tuple.__new__``, without the class's Python ``__new__``)."""
    fields = ", ".join(f"v{i}" for i in range(len(layout)))
    body = ["    def read(data, pos):", "        size = len(data)"]
    for i, code in enumerate(layout):
        body += [f"        {line}" for line in _READ_FIELD[code].format(i=i).splitlines()]
    lines = ["def make(build, max_key, max_value, max_keys, strip):", *body]
    lines += [f"        return build({fields}), pos", "    return read", ""]
    lines += ["def make_tuple(build, max_key, max_value, max_keys, strip):", *body]
    as_tuple = f"({fields},)" if fields else "()"
    lines += [f"        return _new(build, {as_tuple}), pos", "    return read"]
    namespace: dict[str, Any] = {
        "_u64_at": _U64.unpack_from,
        "_i64_at": _I64.unpack_from,
        "_u32_at": _U32.unpack_from,
        "_keys": _keys,
        "_pairs": _pairs,
        "_Slow": _Slow,
        "_new": tuple.__new__,
    }
    exec("\n".join(lines), namespace)
    return namespace["make"], namespace["make_tuple"]


_MAKERS = {op: _compile(layout) for op, layout in REQUEST_LAYOUT.items()}


def _named_tuple(build: object) -> bool:
    return isinstance(build, type) and issubclass(build, tuple) and hasattr(build, "_fields")


def _unknown(data: bytes, pos: int) -> tuple[Any, int]:
    raise _Slow  # the reference parser names the command


def _plain(op: TorchOp) -> Callable[..., TorchRequest]:
    def build(*fields: TorchField) -> TorchRequest:
        return TorchRequest(op, fields)

    return build


_PLAIN: dict[TorchOp, Callable[..., TorchRequest]] = {op: _plain(op) for op in TorchOp}


def store_key(wire_key: str) -> str:
    """The store key for a key as torch's client sends it (its leading ``/`` removed)."""
    return wire_key[1:] if wire_key.startswith("/") else wire_key


class TorchDecoder(Generic[R]):
    """Turns a torch client's byte stream into requests, incrementally.

    Without ``build`` each request is a :class:`TorchRequest` (its op and fields, keys as
    sent). With ``build`` each is ``build[op](*fields)`` (the session's typed requests: no
    tuple in between), and with ``store_keys`` every key loses the leading ``/`` torch's
    client puts in front of it (:func:`store_key`).
    """

    @overload
    def __init__(
        self: TorchDecoder[TorchRequest],
        *,
        max_key_size: int = ...,
        max_value_size: int = ...,
        max_keys: int = ...,
    ) -> None: ...

    @overload
    def __init__(
        self,
        *,
        max_key_size: int = ...,
        max_value_size: int = ...,
        max_keys: int = ...,
        build: Mapping[TorchOp, Callable[..., R]],
        store_keys: bool = ...,
    ) -> None: ...

    def __init__(
        self,
        *,
        max_key_size: int = DEFAULT_MAX_KEY_SIZE,
        max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
        max_keys: int = DEFAULT_MAX_KEYS,
        build: Mapping[TorchOp, Callable[..., Any]] | None = None,
        store_keys: bool = False,
    ) -> None:
        self.max_key_size = max_key_size
        self.max_value_size = max_value_size
        self.max_keys = max_keys
        self.store_keys = store_keys
        self._build: Mapping[TorchOp, Callable[..., Any]] = _PLAIN if build is None else build
        self._readers: list[FastReader] = [_unknown] * 256
        for op, (make, make_tuple) in _MAKERS.items():
            cls = self._build[op]
            self._readers[op] = (make_tuple if _named_tuple(cls) else make)(
                cls, max_key_size, max_value_size, max_keys, store_keys
            )
        self._buffer = bytearray()
        self._need = 0  # don't re-parse before the buffer holds this many bytes
        self.error: TorchProtocolError | None = None
        """Why the stream went bad, once it has; then :meth:`feed` returns nothing more."""

    @property
    def buffered(self) -> int:
        """Bytes received that do not make a whole request yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[R]:
        """Add received bytes; return the requests now complete, in order.

        An unknown op, a length above a limit or a key that is not UTF-8 sets :attr:`error`
        (a :class:`TorchProtocolError`): the requests before it are still returned, nothing
        after it ever is, and the connection should be closed once they are served.
        """
        if self.error is not None:
            return []
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._need:
                return []
            view = bytes(buffer)
            buffer.clear()
        else:
            view = data  # usually whole requests arrive at once: parse them without a copy
        requests: list[R] = []
        readers = self._readers
        start = 0
        end = len(view)
        self._need = 0
        while start < end:
            try:
                request, start = readers[view[start]](view, start + 1)
            except _SLOW_PATH:
                try:
                    request, start = self._parse(view, start)
                except _Incomplete as incomplete:
                    self._need = incomplete.need - start
                    buffer += view[start:]
                    break
                except TorchProtocolError as error:
                    self.error = error
                    break
            requests.append(request)
        return requests

    def _parse(self, data: bytes, offset: int) -> tuple[R, int]:
        """The reference parser: one request at ``offset``, or the error that says why not."""
        code = data[offset]
        try:
            op = TorchOp(code)
        except ValueError:
            raise TorchProtocolError(
                f"unknown torch store command {code} (this server knows 0..{max(TorchOp)}); "
                "is this a torch TCPStore client of another version?"
            ) from None
        offset += 1
        fields: list[TorchField] = []
        for field_code in REQUEST_LAYOUT[op]:
            value, offset = self._read(field_code, op, data, offset)
            fields.append(value)
        request: R = self._build[op](*fields)
        return request, offset

    def _read(self, code: str, op: TorchOp, data: bytes, offset: int) -> tuple[TorchField, int]:
        if code == "k":
            return self._key(op, data, offset)
        if code == "v":
            return self._value(op, data, offset)
        if code == "q":
            _need(data, offset + 8)
            return _I64.unpack_from(data, offset)[0], offset + 8
        if code == "u":
            _need(data, offset + 4)
            return _U32.unpack_from(data, offset)[0], offset + 4
        count, offset = self._count(op, data, offset)
        if code == "K":
            keys: list[str] = []
            for _ in range(count):
                key, offset = self._key(op, data, offset)
                keys.append(key)
            return keys, offset
        pairs: list[tuple[str, bytes]] = []
        for _ in range(count):
            key, offset = self._key(op, data, offset)
            value, offset = self._value(op, data, offset)
            pairs.append((key, value))
        return pairs, offset

    def _length(self, op: TorchOp, what: str, limit: int, data: bytes, offset: int) -> int:
        _need(data, offset + 8)
        length: int = _U64.unpack_from(data, offset)[0]
        if length > limit:
            raise TorchProtocolError(
                f"{op.name} declares a {what} of {length} bytes, above the limit of {limit}"
            )
        return length

    def _key(self, op: TorchOp, data: bytes, offset: int) -> tuple[str, int]:
        length = self._length(op, "key", self.max_key_size, data, offset)
        offset += 8
        _need(data, offset + length)
        try:
            key = data[offset : offset + length].decode()
        except UnicodeDecodeError as error:
            raise TorchProtocolError(f"{op.name} sent a key that is not UTF-8: {error}") from None
        return (store_key(key) if self.store_keys else key), offset + length

    def _value(self, op: TorchOp, data: bytes, offset: int) -> tuple[bytes, int]:
        length = self._length(op, "value", self.max_value_size, data, offset)
        offset += 8
        _need(data, offset + length)
        return data[offset : offset + length], offset + length

    def _count(self, op: TorchOp, data: bytes, offset: int) -> tuple[int, int]:
        _need(data, offset + 8)
        count: int = _U64.unpack_from(data, offset)[0]
        if count > self.max_keys:
            raise TorchProtocolError(
                f"{op.name} names {count} keys, above the limit of {self.max_keys}"
            )
        return count, offset + 8


def _need(data: bytes, end: int) -> None:
    if end > len(data):
        raise _Incomplete(end)


# -- encoding ---------------------------------------------------------------------------------


def encode_key(key: str) -> bytes:
    """A key as torch sends it: 64-bit length, then UTF-8."""
    data = key.encode()
    return _U64.pack(len(data)) + data


def encode_value(value: bytes) -> bytes:
    """A value (or a reply's byte vector): 64-bit length, then the bytes."""
    return _U64.pack(len(value)) + value


def encode_i64(value: int) -> bytes:
    """A signed 64-bit integer; raises ``OverflowError`` outside its range."""
    if value not in _I64_RANGE:
        raise OverflowError(f"{value} does not fit a torch store's 64-bit integer")
    return _I64.pack(value)


def encode_u32(value: int) -> bytes:
    """An unsigned 32-bit integer (the ping nonce)."""
    return _U32.pack(value)


def encode_values(values: Sequence[bytes]) -> bytes:
    """The reply to ``MULTI_GET``: each value in turn."""
    return b"".join(_U64.pack(len(value)) + value for value in values)


def encode_keys(keys: Sequence[str]) -> bytes:
    """The reply to ``LIST_KEYS``: a count, then each key."""
    return encode_i64(len(keys)) + b"".join(encode_key(key) for key in keys)


def encode_queue_pop(length: int, value: bytes | None) -> bytes:
    """The reply to ``QUEUE_POP``: the queue's length before the pop, then the item if any."""
    return encode_i64(length) + (b"" if value is None else encode_value(value))


def encode_request(request: TorchRequest) -> bytes:
    """Encode a request as a torch client would send it (tests and tools use this)."""
    out = [bytes((request.op,))]
    for code, field in zip(REQUEST_LAYOUT[request.op], request.fields, strict=True):
        if code == "k":
            assert isinstance(field, str)
            out.append(encode_key(field))
        elif code == "v":
            assert isinstance(field, bytes)
            out.append(encode_value(field))
        elif code == "q":
            assert isinstance(field, int)
            out.append(encode_i64(field))
        elif code == "u":
            assert isinstance(field, int)
            out.append(encode_u32(field))
        else:
            assert isinstance(field, list)
            out.append(_U64.pack(len(field)))
            for item in field:
                if code == "K":
                    assert isinstance(item, str)
                    out.append(encode_key(item))
                else:
                    assert isinstance(item, tuple)
                    out += (encode_key(item[0]), encode_value(item[1]))
    return b"".join(out)
