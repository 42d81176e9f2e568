"""The TCP store wire codec: round trips and clean errors on any bytes (no sockets here)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store import StoreProtocolError
from aioelastic.store._tcp_codec import (
    _REPLY_KINDS,
    _REQUEST_KINDS,
    PREAMBLE,
    REPLY_FIELDS,
    REQUEST_FIELDS,
    FrameReader,
    Op,
    Reply,
    Request,
    Status,
    _decode,
    _decode_slowly,
    decode_preamble,
    decode_reply,
    decode_request,
    encode_preamble,
    encode_reply,
    encode_request,
    request_reader,
)

T = TypeVar("T")

_FIELD_STRATEGIES: dict[str, st.SearchStrategy[object]] = {
    "s": st.text(max_size=20),
    "b": st.binary(max_size=40),
    "n": st.integers(),
    "i": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "f": st.floats(allow_nan=False),
    "F": st.none() | st.floats(allow_nan=False),
    "?": st.booleans(),
    "S": st.lists(st.text(max_size=10), max_size=5),
    "B": st.lists(st.binary(max_size=10), max_size=5),
}


def _fields(layout: str) -> st.SearchStrategy[tuple[object, ...]]:
    return st.tuples(*(_FIELD_STRATEGIES[code] for code in layout))


_request_ids = st.integers(min_value=0, max_value=2**32 - 1)
_requests = st.sampled_from(list(Op)).flatmap(
    lambda op: st.builds(Request, st.just(op), _request_ids, _fields(REQUEST_FIELDS[op]))
)
_replies = st.sampled_from(list(Status)).flatmap(
    lambda status: st.builds(Reply, st.just(status), _request_ids, _fields(REPLY_FIELDS[status]))
)


def _body(frame: bytes) -> bytes:
    [body] = FrameReader().feed(frame)
    return body


@given(_requests)
def test_request_round_trip(request: Request) -> None:
    """Every request decodes to what was encoded."""
    frame = encode_request(request.op, request.request_id, *request.fields)  # type: ignore[arg-type]
    assert decode_request(_body(frame)) == request


@given(_replies)
def test_reply_round_trip(reply: Reply) -> None:
    """Every reply decodes to what was encoded."""
    frame = encode_reply(reply.status, reply.request_id, *reply.fields)  # type: ignore[arg-type]
    assert decode_reply(_body(frame)) == reply


@given(st.lists(_requests, max_size=8), st.data())
def test_frames_split_anywhere_are_reassembled(
    requests: list[Request], data: st.DataObject
) -> None:
    """A stream cut into arbitrary chunks yields the same frames in order."""
    stream = b"".join(
        encode_request(r.op, r.request_id, *r.fields)  # type: ignore[arg-type]
        for r in requests
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    reader = FrameReader()
    bodies: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        bodies += reader.feed(stream[start:end])
    assert [decode_request(body) for body in bodies] == requests
    assert reader.buffered == 0


def _attempt(decode: Callable[[bytes], T], data: bytes) -> T | StoreProtocolError:
    """Return what ``decode`` returns, or the StoreProtocolError it raises (anything else fails)."""
    try:
        return decode(data)
    except StoreProtocolError as error:
        return error


@given(st.binary(max_size=200))
def test_arbitrary_request_bodies_decode_or_fail_cleanly(body: bytes) -> None:
    """Any bytes either decode to a request that re-encodes, or raise StoreProtocolError."""
    request = _attempt(decode_request, body)
    if isinstance(request, StoreProtocolError):
        assert request.reason
    else:
        frame = encode_request(request.op, request.request_id, *request.fields)
        assert decode_request(_body(frame)) == request


@given(st.binary(max_size=200))
def test_arbitrary_reply_bodies_decode_or_fail_cleanly(body: bytes) -> None:
    """Any bytes either decode to a reply or raise StoreProtocolError, never anything else."""
    reply = _attempt(decode_reply, body)
    assert isinstance(reply, Reply) or reply.reason


@given(st.binary(max_size=300))
def test_arbitrary_streams_split_or_fail_cleanly(stream: bytes) -> None:
    """A frame reader fed any bytes returns bounded frames or refuses an oversized one."""
    bodies = _attempt(FrameReader(max_frame_size=100).feed, stream)
    if isinstance(bodies, StoreProtocolError):
        assert "exceeds the maximum of 100" in bodies.reason
    else:
        assert all(len(body) <= 100 for body in bodies)


def test_oversized_frame_is_refused_before_its_body_arrives() -> None:
    """A length above the limit is refused from the 4-byte prefix alone."""
    reader = FrameReader(max_frame_size=1024)
    with pytest.raises(StoreProtocolError, match="a frame of 1025 bytes exceeds the maximum"):
        reader.feed(struct.pack(">I", 1025))


def test_oversized_frame_names_its_request_id_once_its_header_arrived() -> None:
    """With the header in hand, the refusal names the request, so only that call fails."""
    reader = FrameReader(max_frame_size=1024)
    with pytest.raises(StoreProtocolError, match="a frame of 2000 bytes exceeds") as caught:
        reader.feed(struct.pack(">IBI", 2000, Status.SNAPSHOT, 42))
    assert caught.value.request_id == 42


def test_unknown_operation_names_its_request_id() -> None:
    """An unknown op code is refused with the request id, so the server can answer it."""
    with pytest.raises(StoreProtocolError, match="unknown operation 99") as caught:
        decode_request(bytes([99]) + struct.pack(">I", 7))
    assert caught.value.request_id == 7


def test_truncated_field_says_where() -> None:
    """A field cut short is named with the offset and the bytes missing."""
    body = _body(encode_request(Op.GET, 3, "key", 1.0))[:-2]
    with pytest.raises(StoreProtocolError, match="frame ends inside a float") as caught:
        decode_request(body)
    assert caught.value.request_id == 3


def test_trailing_bytes_are_refused() -> None:
    """Bytes after the last field mean the frame is not what its op says."""
    body = _body(encode_request(Op.NUM_KEYS, 1)) + b"x"
    with pytest.raises(StoreProtocolError, match="1 unexpected bytes after the last field"):
        decode_request(body)


def test_invalid_utf8_key_is_refused() -> None:
    """A key that is not UTF-8 is a protocol error, not a crash."""
    body = bytes([Op.DELETE_KEY]) + struct.pack(">II", 1, 1) + b"\xff"
    with pytest.raises(StoreProtocolError, match="not valid UTF-8"):
        decode_request(body)


def test_huge_list_count_is_refused_without_allocating() -> None:
    """A list count larger than the frame could hold is refused up front."""
    body = bytes([Op.CHECK]) + struct.pack(">II", 1, 2**32 - 1)
    with pytest.raises(StoreProtocolError, match="claims 4294967295 items"):
        decode_request(body)


def test_short_header_has_no_request_id() -> None:
    """A body shorter than its header cannot name a request."""
    with pytest.raises(StoreProtocolError, match="shorter than its 5-byte header") as caught:
        decode_request(b"\x01\x00")
    assert caught.value.request_id is None


def test_preamble_round_trip() -> None:
    """The preamble carries the version."""
    assert decode_preamble(encode_preamble(7)) == 7


def test_foreign_preamble_is_refused() -> None:
    """Bytes from something that is not our client are named in the error."""
    with pytest.raises(StoreProtocolError, match="not an aioelastic store client: first bytes"):
        decode_preamble(b"GET / HTTP/1")


def test_preamble_starts_with_the_magic() -> None:
    """The preamble begins with the magic bytes (the server's first check)."""
    assert encode_preamble().startswith(PREAMBLE)


def _both_ways(body: bytes, kinds: dict[int, Any], what: str) -> tuple[str, str]:
    """What the compiled decoder and the reference readers make of ``body``."""

    def attempt(decode: Callable[..., object]) -> object:
        try:
            return decode(body, kinds, what)
        except StoreProtocolError as error:
            return (type(error), error.reason, error.request_id)

    return repr(attempt(_decode)), repr(attempt(_decode_slowly))  # repr: NaN equals itself


def _near_valid(bodies: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Valid bodies, some with one byte changed or cut short: where decoders can disagree."""

    def mutate(body: bytes, where: int, value: int, cut: bool) -> bytes:
        where %= len(body)
        return body[:where] if cut else body[:where] + bytes([value]) + body[where + 1 :]

    return st.one_of(
        st.binary(max_size=80),
        bodies,
        st.builds(mutate, bodies, st.integers(0, 200), st.integers(0, 255), st.booleans()),
    )


@given(_near_valid(_requests.map(lambda r: _body(_encoded(r)))))
def test_compiled_request_decoder_agrees_with_the_reference_readers(body: bytes) -> None:
    """Any request body decodes (or fails, with the same reason) as the plain readers say."""
    fast, reference = _both_ways(body, _REQUEST_KINDS, "operation")
    assert fast == reference


@given(_near_valid(_replies.map(lambda r: _body(_encoded_reply(r)))))
def test_compiled_reply_decoder_agrees_with_the_reference_readers(body: bytes) -> None:
    """Any reply body decodes (or fails, with the same reason) as the plain readers say."""
    fast, reference = _both_ways(body, _REPLY_KINDS, "reply status")
    assert fast == reference


def _encoded(request: Request) -> bytes:
    return encode_request(request.op, request.request_id, *request.fields)  # type: ignore[arg-type]


def _encoded_reply(reply: Reply) -> bytes:
    return encode_reply(reply.status, reply.request_id, *reply.fields)  # type: ignore[arg-type]


_SAMPLE_FIELDS: dict[str, object] = {
    "s": "ké",
    "b": b"v",
    "n": -12,
    "i": 7,
    "f": 1.5,
    "F": 2.5,
    "?": True,
    "S": ["a", "bc"],
    "B": [b"x"],
}


@pytest.mark.parametrize(
    ("kinds", "what", "frame"),
    [
        (_REQUEST_KINDS, "operation", encode_request(op, 9, *(_SAMPLE_FIELDS[c] for c in layout)))
        for op, layout in REQUEST_FIELDS.items()
    ]
    + [
        (_REPLY_KINDS, "reply status", encode_reply(s, 9, *(_SAMPLE_FIELDS[c] for c in layout)))
        for s, layout in REPLY_FIELDS.items()
    ],
)
def test_compiled_decoder_agrees_on_every_one_byte_change_and_cut(
    kinds: dict[int, Any], what: str, frame: bytes
) -> None:
    """Each byte of a valid body set to 0, 1, 2 or 255, and each cut: same outcome both ways."""
    body = _body(frame)
    variants = [body[:end] for end in range(len(body))]
    variants += [
        body[:at] + bytes([value]) + body[at + 1 :]
        for at in range(len(body))
        for value in (0, 1, 2, 255)
    ]
    for variant in variants:
        fast, reference = _both_ways(variant, kinds, what)
        assert fast == reference, variant


_read_plain = request_reader({op: lambda request_id, *fields: (request_id, fields) for op in Op})


@given(_near_valid(_requests.map(lambda r: _body(_encoded(r)))))
def test_compiled_request_reader_agrees_with_the_reference_readers(body: bytes) -> None:
    """The server's reader (compiled straight into a request) decodes any body, or fails
    with the same reason and request id, as the plain readers say."""

    def attempt(read: Callable[[bytes], object]) -> str:
        try:
            return repr(read(body))  # repr: NaN equals itself
        except StoreProtocolError as error:
            return repr((type(error), error.reason, error.request_id))

    def reference(body: bytes) -> object:
        _, request_id, fields = _decode_slowly(body, _REQUEST_KINDS, "operation")
        return request_id, tuple(fields)

    assert attempt(_read_plain) == attempt(reference)
