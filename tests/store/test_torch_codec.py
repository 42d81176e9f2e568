"""Torch's TCPStore wire codec: torch 2.13's real bytes, round trips, clean errors on any bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic.store._torch_codec import (
    REQUEST_LAYOUT,
    TorchDecoder,
    TorchOp,
    TorchProtocolError,
    TorchRequest,
    _unknown,
    encode_i64,
    encode_keys,
    encode_queue_pop,
    encode_request,
    encode_values,
    looks_like_torch,
)
from aioelastic.store._torch_requests import typed_decoder, typed_request

_FIELDS: dict[str, st.SearchStrategy[object]] = {
    "k": st.text(max_size=20),
    "v": st.binary(max_size=40),
    "q": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "u": st.integers(min_value=0, max_value=2**32 - 1),
    "K": st.lists(st.text(max_size=10), max_size=5),
    "P": st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=10)), max_size=5),
}

_requests = st.sampled_from(list(TorchOp)).flatmap(
    lambda op: st.builds(
        TorchRequest, st.just(op), st.tuples(*(_FIELDS[code] for code in REQUEST_LAYOUT[op]))
    )
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# Captured from torch 2.13's TCPStore client (is_master=False) talking to torch's own server.
_TORCH_213_BYTES = [
    ("00cef7853c", TorchRequest(TorchOp.VALIDATE, (0x3C85F7CE,))),
    ("0d137a0000", TorchRequest(TorchOp.PING, (0x7A13,))),
    ("0102000000000000002f6b010000000000000076", TorchRequest(TorchOp.SET, ("/k", b"v"))),
    ("06010000000000000002000000000000002f6b", TorchRequest(TorchOp.WAIT, (["/k"],))),
    ("0302000000000000002f6b", TorchRequest(TorchOp.GET, ("/k",))),
    ("0402000000000000002f6e0500000000000000", TorchRequest(TorchOp.ADD, ("/n", 5))),
    (
        "0208000000000000002f6d697373696e67010000000000000078010000000000000079",
        TorchRequest(TorchOp.COMPARE_SET, ("/missing", b"x", b"y")),
    ),
    (
        "05020000000000000002000000000000002f6b03000000000000002f7a7a",
        TorchRequest(TorchOp.CHECK, (["/k", "/zz"],)),
    ),
    ("0c", TorchRequest(TorchOp.CANCEL_WAIT)),
    ("07", TorchRequest(TorchOp.GETNUMKEYS)),
    ("0802000000000000002f6b", TorchRequest(TorchOp.DELETE_KEY, ("/k",))),
    ("0902000000000000002f61010000000000000078", TorchRequest(TorchOp.APPEND, ("/a", b"x"))),
    (
        "0a020000000000000002000000000000002f6102000000000000002f6e",
        TorchRequest(TorchOp.MULTI_GET, (["/a", "/n"],)),
    ),
    (
        "0b020000000000000003000000000000002f6d3101000000000000003103000000000000002f6d32"
        "010000000000000032",
        TorchRequest(TorchOp.MULTI_SET, ([("/m1", b"1"), ("/m2", b"2")],)),
    ),
    ("0e02000000000000002f7102000000000000007171", TorchRequest(TorchOp.QUEUE_PUSH, ("/q", b"qq"))),
    ("0f02000000000000002f71", TorchRequest(TorchOp.QUEUE_POP, ("/q",))),
    ("1002000000000000002f71", TorchRequest(TorchOp.QUEUE_LEN, ("/q",))),
    ("11", TorchRequest(TorchOp.LIST_KEYS)),
]


@pytest.mark.parametrize(("wire", "expected"), _TORCH_213_BYTES, ids=lambda v: str(v)[:12])
def test_decodes_what_torch_213_sends(wire: str, expected: TorchRequest) -> None:
    """Each request as torch 2.13's client sent it decodes to the op and fields it meant."""
    assert [expected] == TorchDecoder().feed(bytes.fromhex(wire))


@pytest.mark.parametrize(("wire", "request_"), _TORCH_213_BYTES, ids=lambda v: str(v)[:12])
def test_encodes_what_torch_213_sends(wire: str, request_: TorchRequest) -> None:
    """Encoding a request gives torch 2.13's bytes exactly."""
    assert bytes.fromhex(wire) == encode_request(request_)


def test_replies_match_torch_213() -> None:
    """Replies are laid out as torch 2.13's server sends them."""
    assert bytes.fromhex("0500000000000000") == encode_i64(5)
    assert bytes.fromhex("010000000000000078010000000000000035") == encode_values([b"x", b"5"])
    assert bytes.fromhex("010000000000000002000000000000007171") == encode_queue_pop(1, b"qq")
    assert bytes.fromhex("0000000000000000") == encode_queue_pop(0, None)
    assert bytes.fromhex(
        "020000000000000003000000000000002f626202000000000000002f61"
    ) == encode_keys(["/bb", "/a"])


@settings(suppress_health_check=[HealthCheck.too_slow])  # nested strategies; a shared machine
@given(st.lists(_requests, max_size=4), st.lists(st.integers(min_value=0), max_size=6))
def test_round_trip_in_any_split(requests: list[TorchRequest], cuts: list[int]) -> None:
    """Encoded requests decode to themselves however the stream is split."""
    stream = b"".join(encode_request(request) for request in requests)
    decoder = TorchDecoder()
    decoded = [request for chunk in _split(stream, cuts) for request in decoder.feed(chunk)]
    assert (requests, 0, None) == (decoded, decoder.buffered, decoder.error)


@given(st.binary(max_size=200), st.lists(st.integers(min_value=0), max_size=4))
def test_any_bytes_decode_or_fail_cleanly(data: bytes, cuts: list[int]) -> None:
    """Arbitrary bytes give requests, a wait for more, or a TorchProtocolError: never a crash."""
    decoder = TorchDecoder(max_key_size=64, max_value_size=64, max_keys=8)
    for chunk in _split(data, cuts):
        for request in decoder.feed(chunk):
            assert len(request.fields) == len(REQUEST_LAYOUT[request.op])
    assert decoder.error is None or isinstance(decoder.error, TorchProtocolError)


def test_unknown_command_is_named() -> None:
    """A command byte torch does not define sets an error naming it."""
    decoder = TorchDecoder()
    assert decoder.feed(b"\x63") == []
    assert decoder.error is not None
    assert "unknown torch store command 99" in decoder.error.reason


def test_requests_before_bad_bytes_are_kept() -> None:
    """The requests decoded before the bad bytes are returned; nothing after them ever is."""
    decoder = TorchDecoder()
    good = encode_request(TorchRequest(TorchOp.GETNUMKEYS))
    assert [TorchRequest(TorchOp.GETNUMKEYS)] == decoder.feed(good + b"\xff" + good)
    assert decoder.error is not None
    assert decoder.feed(good) == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x03" + struct.pack("<Q", 2**40), "GET declares a key of 1099511627776 bytes"),
        (b"\x01" + struct.pack("<Q", 1) + b"k" + struct.pack("<Q", 2**62), "SET declares a value"),
        (b"\x06" + struct.pack("<Q", 2**20), "WAIT names 1048576 keys"),
        (b"\x03" + struct.pack("<Q", 2) + b"\xff\xfe", "GET sent a key that is not UTF-8"),
    ],
)
def test_oversized_or_undecodable_fields_fail_at_once(data: bytes, reason: str) -> None:
    """A declared length above the limits fails before its bytes arrive (nothing allocated)."""
    decoder = TorchDecoder()
    assert decoder.feed(data) == []
    assert decoder.error is not None
    assert reason in decoder.error.reason


def test_first_byte_tells_torch_from_ours() -> None:
    """A torch client leads with VALIDATE's zero byte; ours with the AIOESTORE preamble."""
    assert looks_like_torch(bytes.fromhex("00cef7853c"))
    assert not looks_like_torch(b"AIOESTORE\x00\x02")
    assert not looks_like_torch(b"")


def _reference(**limits: int) -> TorchDecoder[TorchRequest]:
    """A decoder that parses every request with the reference parser only."""
    decoder = TorchDecoder(**limits)
    decoder._readers = [_unknown] * 256
    return decoder


def _outcome(decoder: TorchDecoder[object], chunks: list[bytes]) -> tuple[object, ...]:
    decoded = [request for chunk in chunks for request in decoder.feed(chunk)]
    error = None if decoder.error is None else decoder.error.reason
    return decoded, decoder.buffered, error


def _near_valid_stream() -> st.SearchStrategy[bytes]:
    """Valid request streams, some with one byte changed or cut short, and plain bytes."""

    def mutate(data: bytes, where: int, value: int, cut: bool) -> bytes:
        if not data:
            return data
        where %= len(data)
        return data[:where] if cut else data[:where] + bytes([value]) + data[where + 1 :]

    streams = st.lists(_requests, min_size=1, max_size=3).map(
        lambda requests: b"".join(encode_request(request) for request in requests)
    )
    return st.one_of(
        st.binary(max_size=80),
        streams,
        st.builds(mutate, streams, st.integers(0, 300), st.integers(0, 255), st.booleans()),
    )


_SMALL_LIMITS = {"max_key_size": 12, "max_value_size": 16, "max_keys": 3}


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_near_valid_stream(), st.lists(st.integers(min_value=0), max_size=3), st.booleans())
def test_compiled_readers_agree_with_the_reference_parser(
    data: bytes, cuts: list[int], small: bool
) -> None:
    """Any stream, in any split, decodes (or fails, with the same reason, or waits for the
    same bytes) as the reference parser alone says, under the default and small limits."""
    limits = _SMALL_LIMITS if small else {}
    chunks = _split(data, cuts)
    assert _outcome(TorchDecoder(**limits), chunks) == _outcome(_reference(**limits), chunks)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_near_valid_stream(), st.lists(st.integers(min_value=0), max_size=3))
def test_typed_decoding_is_typed_request_of_plain_decoding(data: bytes, cuts: list[int]) -> None:
    """Decoding straight into typed requests (keys as store keys) gives what typed_request
    makes of the plain requests, with the same error and the same bytes left over."""
    chunks = _split(data, cuts)
    plain = TorchDecoder(**_SMALL_LIMITS)
    typed = typed_decoder(**_SMALL_LIMITS)
    expected, buffered, error = _outcome(plain, chunks)
    assert isinstance(expected, list)
    assert _outcome(typed, chunks) == ([typed_request(r) for r in expected], buffered, error)
