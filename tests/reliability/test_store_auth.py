"""The TCP store's token handshake: proofs, never the token, and no replay."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import anyio
import anyio.abc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameterError,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aioelastic.store import StoreRefusedError, TCPStore, TCPStoreServer
from aioelastic.store._auth import NONCE_SIZE, TOKEN_FILE_ENV, check_proof, proof, read_token
from aioelastic.store._peers import OncePerPeer
from aioelastic.store._tcp_codec import (
    FrameReader,
    Op,
    Reply,
    Status,
    decode_reply,
    encode_preamble,
    encode_request,
)
from aioelastic.store._tcp_session import Session
from tests.network.secure_node import recording_proxy
from tests.rendezvous.test_backends import join_all, unused_port

pytestmark = pytest.mark.anyio

TOKEN = b"a-long-random-job-token-0123456789"
nonces = st.binary(min_size=NONCE_SIZE, max_size=NONCE_SIZE)


@given(token=st.binary(min_size=1), client=nonces, server=nonces, other=nonces)
def test_a_proof_checks_only_for_its_role_token_and_nonces(
    token: bytes, client: bytes, server: bytes, other: bytes
) -> None:
    """A proof is accepted for exactly the role, token and nonces it was made for."""
    made = proof(token, "client", client, server)
    assert check_proof(token, "client", client, server, made)
    assert not check_proof(token, "server", client, server, made)
    assert not check_proof(token + b"x", "client", client, server, made)
    if other != server:
        assert not check_proof(token, "client", client, other, made)
    if other != client:
        assert not check_proof(token, "client", other, server, made)


def replay(port: int, data: bytes) -> list[Status]:
    """Send ``data`` on a fresh connection at once; return the replies' statuses to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        reader, statuses = FrameReader(), []
        while chunk := sock.recv(65536):
            statuses += [decode_reply(body).status for body in reader.feed(chunk)]
    return statuses


async def test_the_token_never_crosses_the_wire() -> None:
    """A whole authenticated session carries neither the token nor anything containing it."""
    async with (
        TCPStoreServer(token=TOKEN) as server,
        recording_proxy("127.0.0.1", server.port) as wire,
        TCPStore("127.0.0.1", wire.port, token=TOKEN) as store,
    ):
        await store.set("k", b"v")
        assert await store.get("k") == b"v"
    traffic = b"".join(wire.sent + wire.received)
    assert b"k" in traffic
    assert TOKEN not in traffic


async def test_a_replayed_handshake_does_not_authenticate() -> None:
    """Bytes recorded from a good client, replayed, are refused before any request runs."""
    async with TCPStoreServer(token=TOKEN) as server:
        async with (
            recording_proxy("127.0.0.1", server.port) as wire,
            TCPStore("127.0.0.1", wire.port, token=TOKEN) as store,
        ):
            await store.set("planted", b"by the real client")
            await store.delete_key("planted")
        assert server.statistics().refused_connections == 0
        statuses = await anyio.to_thread.run_sync(replay, server.port, wire.sent[0])
        assert statuses == [Status.CHALLENGE, Status.REFUSED]
        assert not await server.store.check(["planted"])
        assert server.statistics().refused_connections == 1


async def test_a_client_with_a_token_does_not_trust_a_server_without_one() -> None:
    """A server that cannot prove it holds the token (an impostor, say) is refused by the client."""
    async with TCPStoreServer() as impostor:
        with pytest.raises(StoreRefusedError, match="did not prove it holds"):
            async with TCPStore("127.0.0.1", impostor.port, token=TOKEN, connect_timeout=5):
                pass


async def test_a_wrong_token_is_refused_and_counted_by_the_server() -> None:
    """The server refuses a wrong proof, counts it, and keeps serving the right client."""
    async with (
        TCPStoreServer(token=TOKEN) as server,
        TCPStore("127.0.0.1", server.port, token=TOKEN) as good,
    ):
        with pytest.raises(StoreRefusedError, match="the token does not match"):
            async with TCPStore("127.0.0.1", server.port, token=b"wrong", connect_timeout=5):
                pass
        await good.set("still", b"served")
        assert server.statistics().refused_connections == 1


# -- the rendezvous backends ---------------------------------------------------------------


def c10d(port: int, size: tuple[int, int], **conf: str) -> RendezvousParameters:
    return RendezvousParameters("c10d", f"127.0.0.1:{port}", "job", *size, **conf)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_bytes(TOKEN + b"\n")
    path.chmod(0o600)
    return path


async def test_c10d_nodes_with_the_token_file_form_a_world(token_file: Path) -> None:
    """Every node given token_file joins the round over the token-protected store."""
    port = unused_port()
    handlers = [
        get_rendezvous_handler(c10d(port, (2, 2), token_file=str(token_file))) for _ in range(2)
    ]
    infos = await join_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_c10d_token_file_comes_from_the_environment(
    token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without token_file, $AIOELASTIC_STORE_TOKEN_FILE secures the store for every node."""
    port = unused_port()
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file))
    handlers = [get_rendezvous_handler(c10d(port, (2, 2))) for _ in range(2)]
    async with handlers[0]:
        with pytest.raises(StoreRefusedError, match="requires a token"):
            async with TCPStore("127.0.0.1", port, connect_timeout=5):
                pass
    infos = await join_all([*handlers[1:], get_rendezvous_handler(c10d(port, (2, 2)))])
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_c10d_node_with_a_wrong_token_is_refused(token_file: Path, tmp_path: Path) -> None:
    """A node with another token cannot join: its handler fails to open, saying why."""
    wrong = tmp_path / "wrong"
    wrong.write_text("not the job's token")
    port = unused_port()
    async with get_rendezvous_handler(c10d(port, (1, 2), token_file=str(token_file))):
        intruder = c10d(port, (1, 2), is_host="false", read_timeout="5", token_file=str(wrong))
        with pytest.raises(RendezvousConnectionError, match="the token does not match"):
            async with get_rendezvous_handler(intruder):
                pass


async def test_c10d_node_without_the_token_is_refused(token_file: Path) -> None:
    """A node without the token cannot join: its handler fails to open, saying it was refused."""
    port = unused_port()
    async with get_rendezvous_handler(c10d(port, (1, 2), token_file=str(token_file))):
        intruder = get_rendezvous_handler(c10d(port, (1, 2), is_host="false", read_timeout="5"))
        with pytest.raises(RendezvousConnectionError, match="requires a token"):
            async with intruder:
                pass


def test_c10d_unreadable_token_file_is_a_parameter_error(tmp_path: Path) -> None:
    """A token file that cannot be read fails when the handler is created, naming the file."""
    missing = tmp_path / "no-such-token"
    with pytest.raises(RendezvousParameterError, match="no-such-token"):
        get_rendezvous_handler(c10d(unused_port(), (1, 1), token_file=str(missing)))


async def test_c10d_host_without_a_token_warns_once_how_to_set_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hosting node on a non-loopback address without a token says how to set one, once."""
    caplog.set_level(logging.WARNING)
    port = unused_port()
    for _ in range(2):
        async with get_rendezvous_handler(
            RendezvousParameters("c10d", f"0.0.0.0:{port}", "job", 1, 1, is_host="true")
        ):
            pass
    warnings = [r.getMessage() for r in caplog.records if "token_file=PATH" in r.getMessage()]
    assert len(warnings) == 1
    assert TOKEN_FILE_ENV in warnings[0]


async def test_c10d_require_auth_refuses_to_host_without_a_token() -> None:
    """With require_auth=true, hosting beyond loopback without a token is an error."""
    handler = get_rendezvous_handler(
        RendezvousParameters(
            "c10d", f"0.0.0.0:{unused_port()}", "job", 1, 1, is_host="true", require_auth="true"
        )
    )
    with pytest.raises(RendezvousParameterError, match="without a token"):
        async with handler:
            pass


async def test_static_ranks_with_the_token_file_form_a_world(token_file: Path) -> None:
    """The static backend's store takes the same token_file."""
    port = unused_port()
    handlers = [
        get_rendezvous_handler(
            RendezvousParameters(
                "static", f"127.0.0.1:{port}", "job", 2, 2, rank=str(r), token_file=str(token_file)
            )
        )
        for r in range(2)
    ]
    infos = await join_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1]


# -- refusals: counted, logged once per host, costing nobody else ---------------------------


def knock(port: int, source: str, data: bytes) -> list[Status]:
    """From ``source``, send ``data``; return the statuses of the replies until the close."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=30, source_address=(source, 0)
    ) as sock:
        sock.sendall(data)
        reader, statuses = FrameReader(), []
        while chunk := sock.recv(65536):
            statuses += [decode_reply(body).status for body in reader.feed(chunk)]
    return statuses


async def test_refusals_are_counted_and_warned_about_once_per_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Twenty refused knocks from one host and one from another: all counted, two warnings."""
    caplog.set_level(logging.DEBUG, logger="aioelastic.store.tcp")
    no_token = encode_preamble() + encode_request(Op.HELLO, 0, b"")
    async with (
        TCPStoreServer(token=TOKEN) as server,
        TCPStore("127.0.0.1", server.port, token=TOKEN) as good,
    ):
        for n in range(20):
            assert await anyio.to_thread.run_sync(knock, server.port, "127.0.0.1", no_token) == [
                Status.REFUSED
            ]
            await good.set("served", str(n))
        await anyio.to_thread.run_sync(knock, server.port, "127.0.0.2", b"GET / HTTP/1.1\r\n\r\n")
        assert await good.get("served") == b"19"
        stats = server.statistics()
    assert (stats.refused_connections, stats.dropped_connections) == (20, 1)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(":")[0] for w in warned] == ["store client 127.0.0.1", "store client 127.0.0.2"]


def test_once_per_peer_forgets_the_oldest_host_past_its_limit() -> None:
    """Hosts are told apart without their ports, and memory stays bounded."""
    seen = OncePerPeer(limit=2)
    assert [seen.first(p) for p in ("10.0.0.1:5", "10.0.0.1:6", "::1:7", "10.0.0.2:8")] == [
        True,
        False,
        True,
        True,
    ]
    assert len(seen) == 2
    assert seen.first("10.0.0.1:9")  # forgotten, so warned about again


# -- the server's handshake core, byte by byte --------------------------------------------


def feed(session: Session, data: bytes, cuts: list[int]) -> list[Reply]:
    """Feed ``data`` to ``session`` cut at ``cuts``; return the decoded replies."""
    reader, replies, start = FrameReader(), [], 0
    for end in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        replies += [decode_reply(b) for b in reader.feed(session.receive(data[start:end]))]
        start = max(start, end)
    return replies


@given(
    client_nonce=nonces, cuts=st.lists(st.integers(0, 200), max_size=6), flip=st.integers(-1, 31)
)
def test_the_handshake_admits_exactly_the_right_proof_however_the_bytes_arrive(
    client_nonce: bytes, cuts: list[int], flip: int
) -> None:
    """Split anywhere, the right proof gets WELCOME and the server's own proof; any other bit
    pattern (``flip`` >= 0 flips one byte of it) gets REFUSED."""
    server = TCPStoreServer(token=TOKEN)
    session = server.new_session("198.18.0.3:4000")
    hello = encode_preamble() + encode_request(Op.HELLO, 0, client_nonce)
    [challenge] = feed(session, hello, cuts)
    assert challenge.status is Status.CHALLENGE
    (server_nonce,) = challenge.fields
    assert isinstance(server_nonce, bytes)
    offered = bytearray(proof(TOKEN, "client", client_nonce, server_nonce))
    if flip >= 0:
        offered[flip] ^= 0xFF
    [answer] = feed(session, encode_request(Op.AUTH, 0, bytes(offered)), cuts)
    if flip >= 0:
        assert answer.status is Status.REFUSED
        assert session.counts.refused == 1
        return
    assert answer.status is Status.WELCOME
    server_proof = answer.fields[2]
    assert isinstance(server_proof, bytes)
    assert check_proof(TOKEN, "server", client_nonce, server_nonce, server_proof)


async def test_status_reads_a_token_protected_store_with_the_token_file(token_file: Path) -> None:
    """`aioelastic status --rdzv-conf token_file=...` reads the run; without it, it is refused."""
    from aioelastic._launcher.cli_status import fetch_status

    async with TCPStoreServer(token=TOKEN) as server:
        endpoint = f"127.0.0.1:{server.port}"
        status = await fetch_status("c10d", endpoint, "job", {"token_file": str(token_file)}, 10)
        assert (status.round, status.closed) == (0, False)
        with pytest.raises(RendezvousConnectionError, match="requires a token"):
            await fetch_status("c10d", endpoint, "job", {}, 10)


@pytest.mark.parametrize(
    ("content", "mode", "warning"),
    [
        ("a" * 40, 0o644, "readable by every user"),
        ("s3cr3t", 0o600, "short enough to guess offline"),
    ],
    ids=["world-readable", "short"],
)
def test_a_token_file_that_is_easy_to_steal_or_guess_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, mode: int, warning: str
) -> None:
    """The token is still read, with a warning saying what to fix (and not the token)."""
    path = tmp_path / "token"
    path.write_text(content)
    path.chmod(mode)
    assert read_token(path) == content.encode()
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 1
    assert warning in messages[0]
    assert content not in messages[0]


def test_a_private_long_token_file_is_read_without_a_word(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0600 file with a long token: no warning."""
    assert read_token(token_file) == TOKEN
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
