"""The TCP store's token handshake, as pure functions: no sockets, no clock.

Theory of operation. Both ends hold the same shared token and neither ever sends it. The
client's ``HELLO`` carries a fresh random nonce. A server that requires a token answers
``CHALLENGE`` with a fresh nonce of its own; the client answers ``AUTH`` with
:func:`proof` for the client role over both nonces; the server checks it and its ``WELCOME``
carries the proof for the server role, which the client checks in turn. So each end learns
that the other knows the token, and a recorded handshake is worthless: the next connection
gets a new server nonce, so a replayed ``AUTH`` does not match it, and the role label keeps a
server's proof from being reflected back as a client's.

What this does not do: the frames after the handshake are neither encrypted nor signed, so
someone who can read or inject packets on the path sees the values and can tamper with a
connection once it is open. TLS (``ssl=`` on both ends) closes that. A passive listener could
also try to guess a weak token offline from one handshake: use a long random token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import stat
from pathlib import Path
from typing import Literal

TOKEN_FILE_ENV = "AIOELASTIC_STORE_TOKEN_FILE"
"""The environment variable naming the token file where no ``token_file`` is given."""

MIN_TOKEN_SIZE = 16
"""Tokens shorter than this are warned about (a recorded handshake lets one be guessed)."""

log = logging.getLogger("aioelastic.store.auth")

NONCE_SIZE = 32
"""Bytes of each nonce (and of each proof: HMAC-SHA256)."""

_LABEL = b"aioelastic-store-v3"
"""Binds a proof to this protocol, so it is useless anywhere else."""

Role = Literal["client", "server"]


def new_nonce() -> bytes:
    """Return a fresh unpredictable nonce."""
    return secrets.token_bytes(NONCE_SIZE)


def proof(token: bytes, role: Role, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """Return what ``role`` sends to prove it knows ``token`` on the connection of these nonces."""
    message = b"|".join((_LABEL, role.encode(), client_nonce, server_nonce))
    return hmac.new(token, message, hashlib.sha256).digest()


def check_proof(
    token: bytes, role: Role, client_nonce: bytes, server_nonce: bytes, offered: bytes
) -> bool:
    """Return whether ``offered`` is ``role``'s proof for these nonces (in constant time)."""
    return hmac.compare_digest(offered, proof(token, role, client_nonce, server_nonce))


def read_token(path: str | Path) -> bytes:
    """Return the token in the file ``path`` (surrounding whitespace dropped).

    Raises ``ValueError`` saying why when the file cannot be read or holds no token; the
    message never contains the token. Warns when other users may read the file, or when the
    token is short enough to be guessed offline from a recorded handshake.
    """
    file = Path(path)
    try:
        token = file.read_bytes().strip()
        mode = file.stat().st_mode
    except OSError as error:
        raise ValueError(f"cannot read the token file {str(path)!r}: {error.strerror}") from None
    if not token:
        raise ValueError(f"the token file {str(path)!r} is empty; put a secret in it")
    if mode & stat.S_IROTH:
        log.warning("the token file %r is readable by every user; chmod o-r it", str(path))
    if len(token) < MIN_TOKEN_SIZE:
        log.warning(
            "the token in %r has %d bytes: short enough to guess offline from one recorded "
            "handshake; use at least %d random bytes (python -c 'import secrets; "
            "print(secrets.token_hex(32))')",
            str(path),
            len(token),
            MIN_TOKEN_SIZE,
        )
    return token
