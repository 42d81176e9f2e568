"""The client's half of the TCP store protocol that does no I/O: the handshake, and what a
reply means.

Both clients are shells over it: the async :class:`~aioelastic.store.TCPStore` and the blocking
:class:`~aioelastic.store.BlockingTCPStore` send what :class:`ClientHandshake` says to send and
feed it the frames that come back, until it has the server's :class:`Welcome`; afterwards
:func:`check_reply` turns each reply into its result or the exception it stands for. The
handshake itself (a nonce in ``HELLO``, the server's ``CHALLENGE``, the client's ``AUTH`` proof,
the server's proof in ``WELCOME``) is described in :mod:`._tcp_codec` and :mod:`._auth`.
"""

from __future__ import annotations

from typing import NamedTuple

from aioelastic.store._auth import check_proof, new_nonce, proof
from aioelastic.store._errors import (
    StoreClosedError,
    StoreProtocolError,
    StoreRefusedError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._tcp_codec import Op, Reply, Status, decode_reply, encode_preamble
from aioelastic.store._tcp_codec import encode_request as _encode_request


class Welcome(NamedTuple):
    """What a server said once the handshake is done."""

    epoch: int
    """Changes when the server restarts (and its keys are gone)."""
    max_frame_size: int
    """The largest frame body the server accepts."""


class ClientHandshake:
    """One connection's handshake, without I/O: :meth:`start`, then :meth:`receive` each frame.

    Raises :class:`StoreRefusedError` (the server refused, wants a token this client lacks, or
    could not prove it holds this client's token) or :class:`StoreProtocolError` (it answered
    with something that is not a handshake reply).
    """

    def __init__(self, endpoint: str, token: bytes = b"") -> None:
        self.endpoint = endpoint
        self.token = token
        self.client_nonce = new_nonce() if token else b""
        self.server_nonce = b""
        self.welcome: Welcome | None = None
        """The server's welcome, once the handshake is done."""

    def start(self) -> bytes:
        """The bytes a client sends first: the preamble and ``HELLO``."""
        return encode_preamble() + _encode_request(Op.HELLO, 0, self.client_nonce)

    def receive(self, body: bytes) -> bytes:
        """Take one reply frame body; return what to send next (empty once :attr:`welcome`
        is set)."""
        reply = decode_reply(body)
        if reply.status is Status.REFUSED:
            raise StoreRefusedError(self.endpoint, f"refused the connection: {reply.fields[0]!s}")
        token = self.token
        if reply.status is Status.CHALLENGE and not self.server_nonce:
            if not token:
                raise StoreRefusedError(
                    self.endpoint,
                    "the server requires a token and this client has none; pass the server's "
                    "token (TCPStore(token=...), --rdzv-conf token_file=PATH)",
                )
            (challenge,) = reply.fields
            assert isinstance(challenge, bytes)
            self.server_nonce = challenge
            client_proof = proof(token, "client", self.client_nonce, challenge)
            return _encode_request(Op.AUTH, 0, client_proof)
        if reply.status is not Status.WELCOME:
            raise StoreProtocolError(f"expected WELCOME, got {reply.status.name}")
        epoch, limit, server_proof = reply.fields
        assert isinstance(epoch, int)
        assert isinstance(limit, int)
        assert isinstance(server_proof, bytes)
        if token and not (
            self.server_nonce
            and check_proof(token, "server", self.client_nonce, self.server_nonce, server_proof)
        ):
            raise StoreRefusedError(
                self.endpoint,
                "the server did not prove it holds this client's token, so it may not be the "
                "job's store; start the server with the same token",
            )
        self.welcome = Welcome(epoch, limit)
        return b""


def check_reply(reply: Reply, endpoint: str) -> Reply:
    """Return ``reply`` if it carries a result; raise the exception its error status stands for."""
    status = reply.status
    if status < Status.TIMEOUT:
        return reply
    if status is Status.TIMEOUT:
        keys, timeout = reply.fields
        assert isinstance(keys, list)
        assert isinstance(timeout, float)
        raise StoreTimeoutError([str(key) for key in keys], timeout, endpoint)
    message = str(reply.fields[0])
    if status is Status.VALUE_ERROR:
        raise StoreValueError(message)
    if status is Status.INVALID:
        raise ValueError(message)
    if status is Status.CLOSED:
        raise StoreClosedError(message)
    raise StoreProtocolError(f"the server refused the request: {message}")
