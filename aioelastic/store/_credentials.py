"""What a node needs to serve and to reach an authenticated TCP store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioelastic.store._auth import read_token
from aioelastic.store._tcp_client import TCPStore
from aioelastic.store._tcp_server import TCPStoreServer


@dataclass(frozen=True, slots=True)
class StoreCredentials:
    """A node's token, for the server it may host and the client it opens.

    Build it with :meth:`from_files` (the same file on every node). ``require_auth`` makes a
    server that would listen beyond loopback without a token refuse to start.
    """

    token: bytes | None = None
    require_auth: bool = False

    @classmethod
    def from_files(
        cls,
        *,
        token_file: str | Path | None = None,
        require_auth: bool = False,
    ) -> StoreCredentials:
        """Read the token file; raise ``ValueError`` saying what is wrong."""
        token = None if token_file is None else read_token(token_file)
        return cls(token, require_auth=require_auth)

    def server(self, host: str, port: int = 0, **options: Any) -> TCPStoreServer:
        """A :class:`TCPStoreServer` that requires these credentials of its clients."""
        return TCPStoreServer(
            host,
            port,
            token=self.token,
            require_auth=self.require_auth,
            **options,
        )

    def client(self, host: str, port: int, **options: Any) -> TCPStore:
        """A :class:`TCPStore` that presents these credentials (and checks the server's)."""
        return TCPStore(host, port, token=self.token, **options)
