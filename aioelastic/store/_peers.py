"""Which peers a server already warned about, so a flood from one host logs one warning."""

from __future__ import annotations

DEFAULT_LIMIT = 4096
"""Peers remembered at most; past that the oldest is forgotten (and may be warned about again)."""


def peer_host(peer: str) -> str:
    """The host part of ``host:port`` (IPv6 hosts keep their colons)."""
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer


class OncePerPeer:
    """Answers, for each problem a peer causes, whether it is that host's first one."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._seen: dict[str, None] = {}  # insertion-ordered: the oldest first

    def first(self, peer: str) -> bool:
        """Return True the first time the host of ``peer`` (``host:port``) is seen."""
        host = peer_host(peer)
        if host in self._seen:
            return False
        if len(self._seen) >= self.limit:
            del self._seen[next(iter(self._seen))]
        self._seen[host] = None
        return True

    def __len__(self) -> int:
        return len(self._seen)
