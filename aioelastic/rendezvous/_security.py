"""The config keys that secure a TCP-store backend (``c10d``, ``static``) and their parsing.

``token_file`` (default: ``$AIOELASTIC_STORE_TOKEN_FILE``) names a file holding a shared
secret: the node hosting the store requires it and every node proves it holds it.
``cacert``, ``cert`` and ``key`` (PEM files, the etcd backend's names) turn on TLS with
certificates checked both ways. ``require_auth=true`` makes a hosting node that would listen
beyond loopback with neither refuse to start instead of warning.
"""

from __future__ import annotations

import os

from aioelastic.rendezvous._errors import RendezvousParameterError
from aioelastic.rendezvous._parameters import RendezvousParameters
from aioelastic.store._auth import TOKEN_FILE_ENV
from aioelastic.store._credentials import StoreCredentials

SECURITY_KEYS = frozenset({"token_file", "cacert", "cert", "key", "require_auth"})
"""Config keys of the backends that run over the TCP store (besides their own)."""


def store_credentials(params: RendezvousParameters) -> StoreCredentials:
    """Read the token and TLS files ``params`` name; raise naming what is wrong."""
    token_file = params.get("token_file") or os.environ.get(TOKEN_FILE_ENV) or None
    try:
        return StoreCredentials.from_files(
            token_file=token_file,
            cacert=params.get("cacert") or None,
            cert=params.get("cert") or None,
            key=params.get("key") or None,
            require_auth=bool(params.get_as_bool("require_auth", False)),
        )
    except ValueError as error:
        raise RendezvousParameterError(
            f"cannot secure the {params.backend} rendezvous store: {error}"
        ) from None


PROTECTING_KEYS = frozenset(
    {"token_file", "cacert", "cert", "key", "ca_cert", "ssl_cert", "ssl_cert_key", "user"}
)
"""Config keys that protect a job's store: a token, TLS (any backend's names), etcd's user."""


def store_is_protected(params: RendezvousParameters) -> bool:
    """Whether the job's store asks its clients for a token, TLS or a password (no file read)."""
    if any(params.get(key) for key in PROTECTING_KEYS) or os.environ.get(TOKEN_FILE_ENV):
        return True
    return str(params.get("protocol", "http")).lower() == "https"
