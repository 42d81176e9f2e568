"""What a node needs to serve and to reach an authenticated TCP store: a token, TLS, or both."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioelastic.store._auth import read_token
from aioelastic.store._tcp_client import TCPStore
from aioelastic.store._tcp_server import TCPStoreServer
from aioelastic.store._tls import client_context, server_context


@dataclass(frozen=True, slots=True)
class StoreCredentials:
    """A node's token and TLS contexts, for the server it may host and the client it opens.

    Build it with :meth:`from_files` (the same token file on every node; each node's own
    certificate from the job's CA). ``require_auth`` makes a server that would listen beyond
    loopback with neither a token nor TLS refuse to start.
    """

    token: bytes | None = None
    require_auth: bool = False
    server_tls: ssl.SSLContext | None = None
    client_tls: ssl.SSLContext | None = None

    @classmethod
    def from_files(
        cls,
        *,
        token_file: str | Path | None = None,
        cacert: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        require_auth: bool = False,
    ) -> StoreCredentials:
        """Read the token file and load the TLS files; raise ``ValueError`` saying what is wrong.

        TLS needs all three of ``cacert``, ``cert`` and ``key``: each node may host the store
        (it presents ``cert``) and reaches it as a client (it presents ``cert`` too).
        """
        token = None if token_file is None else read_token(token_file)
        files = {"cacert": cacert, "cert": cert, "key": key}
        missing = [name for name, path in files.items() if path is None]
        if len(missing) == len(files):
            return cls(token, require_auth)
        if missing:
            raise ValueError(
                f"TLS needs cacert, cert and key; {', '.join(missing)} missing (every node "
                "presents its certificate and checks the others' against the CA)"
            )
        assert cacert is not None
        assert cert is not None
        assert key is not None
        return cls(
            token,
            require_auth,
            server_context(cacert, cert, key),
            client_context(cacert, cert, key),
        )

    def server(self, host: str, port: int = 0, **options: Any) -> TCPStoreServer:
        """A :class:`TCPStoreServer` that requires these credentials of its clients."""
        return TCPStoreServer(
            host,
            port,
            token=self.token,
            ssl=self.server_tls,
            require_auth=self.require_auth,
            **options,
        )

    def client(self, host: str, port: int, **options: Any) -> TCPStore:
        """A :class:`TCPStore` that presents these credentials (and checks the server's)."""
        return TCPStore(host, port, token=self.token, ssl=self.client_tls, **options)
