"""The server's per-connection protocol core as plain calls: no sockets, no event loop."""

from __future__ import annotations

import dataclasses

from hypothesis import given

from aioelastic.store import MemoryStore
from aioelastic.store._peers import OncePerPeer
from aioelastic.store._tcp_codec import (
    REQUEST_FIELDS,
    FrameReader,
    Op,
    Reply,
    Request,
    Status,
    decode_reply,
    encode_preamble,
    encode_request,
)
from aioelastic.store._tcp_requests import REQUEST_TYPES, Get, Wait, read_request
from aioelastic.store._tcp_session import HANDLERS, Phase, Session, SessionPolicy, StoreSession
from tests.store.test_tcp_codec import _body, _requests


def policy(**changes: object) -> SessionPolicy:
    defaults = SessionPolicy(
        epoch=7,
        max_frame_size=1 << 20,
        handshake_timeout=10.0,
        token=None,
        torch_clients=True,
        unauthenticated=OncePerPeer(),
    )
    return dataclasses.replace(defaults, **changes)  # type: ignore[arg-type]


def open_session(store: MemoryStore | None = None) -> StoreSession:
    """A session past its handshake (no token)."""
    session = StoreSession(store or MemoryStore(), "198.18.0.9:1", policy())
    [welcome] = replies(session, encode_preamble() + encode_request(Op.HELLO, 0, b""))
    assert welcome.status is Status.WELCOME
    return session


def replies(session: Session, data: bytes) -> list[Reply]:
    return [decode_reply(body) for body in FrameReader().feed(session.receive(data))]


def test_every_op_has_a_request_class_with_its_layout() -> None:
    """Each typed request names one field per code of its op's layout, in order."""
    assert set(REQUEST_TYPES) == set(Op)
    for op, cls in REQUEST_TYPES.items():
        names = [f.name for f in dataclasses.fields(cls)]
        assert (cls.op, names[0], len(names) - 1) == (op, "request_id", len(REQUEST_FIELDS[op]))


@given(_requests)
def test_typed_requests_carry_the_decoded_fields(request: Request) -> None:
    """read_request gives the op's class holding the request id and fields as decoded."""
    typed = read_request(_body(encode_request(request.op, request.request_id, *request.fields)))
    assert (typed.op, dataclasses.astuple(typed)) == (
        request.op,
        (request.request_id, *request.fields),
    )


def test_every_answerable_op_is_in_the_dispatch_table() -> None:
    """Only the session's own control frames are not in the table."""
    table_ops = {cls.op for cls in HANDLERS}
    assert set(Op) - table_ops == {Op.HELLO, Op.AUTH, Op.CANCEL}


def test_a_request_answered_at_once_comes_back_in_the_same_call() -> None:
    """set then add: both replies from one receive, in order, nothing parked."""
    session = open_session()
    data = encode_request(Op.SET, 1, "k", b"v", None) + encode_request(Op.ADD, 2, "n", 5)
    assert [(r.status, r.request_id, r.fields) for r in replies(session, data)] == [
        (Status.OK, 1, ()),
        (Status.INT, 2, (5,)),
    ]
    assert (session.parked, session.counts.requests) == ([], 2)


def test_a_wait_on_a_missing_key_is_parked_not_answered() -> None:
    """get of a missing key: no reply, the request handed to the shell to hold."""
    session = open_session()
    assert replies(session, encode_request(Op.GET, 3, "missing", 5.0)) == []
    assert session.parked == [Get(3, "missing", 5.0)]


def test_a_wait_on_a_present_key_is_answered_at_once() -> None:
    """wait on keys that exist: OK now, nothing parked."""
    store = MemoryStore()
    store.set_nowait("a", b"1")
    session = open_session(store)
    [reply] = replies(session, encode_request(Op.WAIT, 4, ["a"], 5.0))
    assert (reply.status, reply.request_id, session.parked) == (Status.OK, 4, [])


def test_cancel_withdraws_only_a_held_wait() -> None:
    """CANCEL of a parked id is passed on to the shell; of an unknown id, ignored."""
    session = open_session()
    replies(session, encode_request(Op.WAIT, 5, ["x"], 5.0))
    session.parked.clear()
    assert replies(session, encode_request(Op.CANCEL, 6) + encode_request(Op.CANCEL, 5)) == []
    assert session.withdrawn == [5]


def test_a_second_wait_with_the_same_id_is_refused() -> None:
    """Two waits may not share a request id on one connection."""
    session = open_session()
    replies(session, encode_request(Op.WAIT, 5, ["x"], 5.0))
    [reply] = replies(session, encode_request(Op.WAIT, 5, ["y"], 5.0))
    assert reply.status is Status.BAD_REQUEST
    assert "already waiting" in str(reply.fields[0])


def test_settle_replies_unless_cancelled_or_closed() -> None:
    """A held wait's outcome is sent while open; a cancelled one (None) or a closed session
    sends nothing, and the id may be used again."""
    session = open_session()
    replies(session, encode_request(Op.WAIT, 8, ["x"], 5.0))
    ok = encode_request(Op.NUM_KEYS, 8)  # any frame stands for the encoded reply here
    assert session.settle(Wait(8, ["x"], 5.0), None) is None
    replies(session, encode_request(Op.WAIT, 8, ["x"], 5.0))  # not refused: id is free again
    assert session.parked[-1] == Wait(8, ["x"], 5.0)
    assert session.settle(Wait(8, ["x"], 5.0), ok) == ok
    session.close()
    assert session.phase is Phase.CLOSED
    assert session.settle(Wait(8, ["x"], 5.0), ok) is None


def test_a_negative_timeout_is_invalid_not_parked() -> None:
    """A wait with a negative timeout gets INVALID and holds nothing."""
    session = open_session()
    [reply] = replies(session, encode_request(Op.GET, 9, "k", -1.0))
    assert (reply.status, session.parked) == (Status.INVALID, [])


def test_torch_bytes_end_the_handshake_for_a_handover() -> None:
    """A torch client's first bytes are kept for the shell; a server that refuses torch
    clients says REFUSED-by-closing instead."""
    session = StoreSession(MemoryStore(), "p:1", policy())
    assert session.receive(b"\x00\xce\xf7\x85\x3c") == b""
    assert (session.torch_bytes, session.open) == (b"\x00\xce\xf7\x85\x3c", True)
    refusing = StoreSession(MemoryStore(), "p:1", policy(torch_clients=False))
    assert refusing.receive(b"\x00\xce\xf7\x85\x3c") == b""
    assert (refusing.torch_bytes, refusing.closing, refusing.counts.refused) == (None, True, 1)
