"""The pure wire codec: PyTorch's version-1 JSON line, decoding of bad input, line framing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.timer import (
    PIPE_BUF,
    LineDecoder,
    Rejection,
    RejectReason,
    TimerRequest,
    decode_line,
)
from aioelastic.timer import encode_request as encode

requests = st.builds(
    TimerRequest,
    pid=st.integers(-(2**63), 2**63),
    scope_id=st.text(max_size=200),
    expiration_time=st.floats(allow_nan=False, allow_infinity=False),
    signal=st.integers(-64, 64),
)


def test_encoding_is_pytorchs_line() -> None:
    """Version 1 is a JSON object with torch's keys in torch's order, then a newline."""
    line = encode(TimerRequest(42, "step", 1700000000.5, 9))
    assert line == (
        b'{"version": 1, "pid": 42, "scope_id": "step", '
        b'"expiration_time": 1700000000.5, "signal": 9}\n'
    )


@given(requests)
def test_encode_then_decode_round_trips(request: TimerRequest) -> None:
    """Decoding an encoded request gives the same request back."""
    assert decode_line(encode(request)[:-1]) == request


def test_release_from_torch_decodes_as_release() -> None:
    """Torch's release line (expiration_time -1, an int) decodes as a release."""
    decoded = decode_line(
        b'{"version": 1, "pid": 5, "scope_id": "s", "expiration_time": -1, "signal": 0}'
    )
    assert isinstance(decoded, TimerRequest)
    assert decoded.is_release


GOOD = {"version": 1, "pid": 5, "scope_id": "s", "expiration_time": 10.0, "signal": 9}


@pytest.mark.parametrize(
    ("line", "reason", "detail"),
    [
        (b"\xff\xfe{}", RejectReason.NOT_UTF8, "invalid start byte"),
        (b"{not json", RejectReason.INVALID_JSON, "Expecting property name"),
        (b"[1, 2]", RejectReason.NOT_AN_OBJECT, "not a JSON object"),
        (json.dumps({**GOOD, "version": 2}).encode(), RejectReason.UNSUPPORTED_VERSION, "2"),
        (json.dumps({**GOOD, "version": True}).encode(), RejectReason.UNSUPPORTED_VERSION, "True"),
        (
            json.dumps({k: v for k, v in GOOD.items() if k != "scope_id"}).encode(),
            RejectReason.MISSING_FIELD,
            "'scope_id'",
        ),
        (json.dumps({**GOOD, "pid": "5"}).encode(), RejectReason.WRONG_TYPE, "'pid' is '5'"),
        (json.dumps({**GOOD, "pid": True}).encode(), RejectReason.WRONG_TYPE, "'pid' is True"),
        (json.dumps({**GOOD, "signal": 9.0}).encode(), RejectReason.WRONG_TYPE, "'signal'"),
        (
            json.dumps({**GOOD, "expiration_time": "soon"}).encode(),
            RejectReason.WRONG_TYPE,
            "not a number",
        ),
        (
            json.dumps({**GOOD, "expiration_time": float("nan")}).encode(),
            RejectReason.BAD_VALUE,
            "nan",
        ),
        (b"x" * PIPE_BUF, RejectReason.TOO_LONG, "4097 bytes"),
    ],
)
def test_bad_lines_are_rejected_with_a_reason(
    line: bytes, reason: RejectReason, detail: str
) -> None:
    """Each kind of bad line gives a rejection naming what was wrong."""
    decoded = decode_line(line)
    assert isinstance(decoded, Rejection)
    assert decoded.reason == reason
    assert detail in decoded.detail


def test_rejection_keeps_the_pid_when_it_is_readable() -> None:
    """A line with a readable pid but a bad field reports that pid."""
    decoded = decode_line(json.dumps({**GOOD, "signal": "KILL"}).encode())
    assert isinstance(decoded, Rejection)
    assert decoded.pid == 5


def test_one_bad_line_costs_only_itself() -> None:
    """Good lines around a bad one in the same read all decode."""
    good = encode(TimerRequest(5, "a", 10.0, 9))
    out = LineDecoder().feed(good + b"garbage\n" + good)
    assert [type(x) for x in out] == [TimerRequest, Rejection, TimerRequest]


def test_partial_line_waits_for_its_newline() -> None:
    """A line split across reads is decoded once the rest arrives."""
    line = encode(TimerRequest(5, "a", 10.0, 9))
    decoder = LineDecoder()
    assert decoder.feed(line[:10]) == []
    assert decoder.pending == 10
    assert decoder.feed(line[10:]) == [TimerRequest(5, "a", 10.0, 9)]
    assert decoder.pending == 0


def test_overlong_partial_line_is_dropped_up_to_its_newline() -> None:
    """A line growing past PIPE_BUF over several reads is reported once and skipped."""
    decoder = LineDecoder()
    first = decoder.feed(b"y" * PIPE_BUF)
    assert [r.reason for r in first if isinstance(r, Rejection)] == [RejectReason.TOO_LONG]
    assert decoder.feed(b"y" * 5000) == []
    good = encode(TimerRequest(5, "a", 10.0, 9))
    assert decoder.feed(b"tail\n" + good) == [TimerRequest(5, "a", 10.0, 9)]


def test_blank_lines_are_ignored() -> None:
    """Empty and whitespace-only lines produce nothing."""
    assert LineDecoder().feed(b"\n  \n\n") == []


@given(st.lists(requests, max_size=20), st.lists(st.integers(0, 5000), max_size=10))
def test_any_split_of_the_stream_decodes_the_same(
    items: list[TimerRequest], cuts: list[int]
) -> None:
    """However reads split the byte stream, the decoded requests are the same."""
    stream = b"".join(encode(r) for r in items)
    decoder = LineDecoder()
    out: list[TimerRequest | Rejection] = []
    last = 0
    for cut in sorted(c for c in cuts if c <= len(stream)):
        out += decoder.feed(stream[last:cut])
        last = cut
    out += decoder.feed(stream[last:])
    expected = [r if len(encode(r)) <= PIPE_BUF else None for r in items]
    assert [x if isinstance(x, TimerRequest) else None for x in out] == expected


@given(st.binary(max_size=3000))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    """Garbage yields one result per non-blank complete line and never an exception."""
    out = LineDecoder().feed(data + b"\n")
    assert len(out) == sum(1 for line in data.split(b"\n") if line.strip())


SMUGGLING = [
    b'{"version": 1, "pid": 5, "scope_id": "s", "expiration_time": 10.0, "signal": 9, "x": "}',
    b'{", "pid": 666}',
    b'{"a": 1},{"b": 2}',
]
"""Three lines none of which is a request alone, which joined with commas in a JSON array read
as three objects, the first a request for pid 666 that no line holds."""


def test_lines_cannot_lend_each_other_values() -> None:
    """Each line decodes from its own bytes only: lines that would merge when parsed together
    are each rejected, and no request appears that no line holds."""
    out = LineDecoder().feed(b"".join(line + b"\n" for line in SMUGGLING))
    assert [decode_line(line) for line in SMUGGLING] == out
    assert [type(x) for x in out] == [Rejection, Rejection, Rejection]


_fragments = st.sampled_from(
    [
        b"{",
        b"}",
        b'"',
        b",",
        b":",
        b" ",
        b"[",
        b"]",
        b"\\",
        b'"pid": 666',
        b'"version": 1',
        b'"scope_id": "s"',
        b'"expiration_time": 1.5',
        b'"signal": 9',
        b"1",
        b"-1",
        b"null",
        b"\xff",
    ]
)
_lines = st.one_of(
    requests.map(lambda r: encode(r)[:-1]),
    st.lists(_fragments, max_size=30).map(b"".join),
    st.sampled_from(SMUGGLING),
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")),
)


@given(st.lists(_lines, max_size=30))
def test_a_read_of_many_lines_decodes_as_each_line_alone(lines: list[bytes]) -> None:
    """Whatever the lines hold, a read of many gives what decoding each alone gives, in order
    (so a bad or crafted line costs itself only and cannot change another line's request)."""
    out = LineDecoder().feed(b"".join(line + b"\n" for line in lines))
    assert [decode_line(line) for line in lines if line.strip()] == out
