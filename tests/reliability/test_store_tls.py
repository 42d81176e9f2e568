"""The TCP store over TLS: certificates checked both ways, failures refused before any request."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import anyio
import pytest
import trustme

from aioelastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameterError,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aioelastic.store import StoreRefusedError, TCPStore
from aioelastic.store._credentials import StoreCredentials
from aioelastic.store._tcp_codec import Op, encode_preamble, encode_request
from aioelastic.store._tls import client_context, server_context
from tests.rendezvous.test_backends import join_all, unused_port

pytestmark = pytest.mark.anyio


class Pki:
    """A throwaway CA and, per node, PEM files under ``directory``."""

    def __init__(self, directory: Path, ca: trustme.CA | None = None) -> None:
        directory.mkdir(exist_ok=True)
        self.directory = directory
        self.ca = ca or trustme.CA()
        self.cacert = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.cacert))

    def node(self, name: str, *identities: str) -> tuple[Path, Path]:
        """Issue a certificate for ``identities`` (default: loopback); return (cert, key)."""
        issued = self.ca.issue_cert(*(identities or ("127.0.0.1", "localhost")))
        cert, key = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return cert, key

    def credentials(self, name: str, *identities: str) -> StoreCredentials:
        cert, key = self.node(name, *identities)
        return StoreCredentials.from_files(cacert=self.cacert, cert=cert, key=key)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


async def test_nodes_with_certificates_from_the_ca_are_served(pki: Pki) -> None:
    """Server and client present certificates from the job's CA; the store works over TLS."""
    server_side, client_side = pki.credentials("server"), pki.credentials("client")
    async with server_side.server("127.0.0.1") as server:
        async with client_side.client("127.0.0.1", server.port) as store:
            await store.set("k", b"v")
            assert await store.get("k") == b"v"
        assert server.statistics().refused_connections == 0


async def test_a_client_without_a_certificate_is_refused(pki: Pki) -> None:
    """A client that trusts the CA but presents no certificate is refused, and counted."""
    async with pki.credentials("server").server("127.0.0.1") as server:
        anonymous = client_context(pki.cacert)
        with pytest.raises(StoreRefusedError, match="alert certificate required"):
            async with TCPStore("127.0.0.1", server.port, ssl=anonymous, connect_timeout=30):
                pass
        stats = server.statistics()
        assert (stats.refused_connections, stats.requests, stats.connections) == (1, 0, 0)


async def test_a_client_certificate_from_another_ca_is_refused(pki: Pki, tmp_path: Path) -> None:
    """A certificate signed by another CA does not open the store."""
    (tmp_path / "other").mkdir()
    stranger = Pki(tmp_path / "other")
    cert, key = stranger.node("stranger")
    forged = client_context(pki.cacert, cert, key)
    async with pki.credentials("server").server("127.0.0.1") as server:
        with pytest.raises(StoreRefusedError, match="alert unknown ca"):
            async with TCPStore("127.0.0.1", server.port, ssl=forged, connect_timeout=30):
                pass
        assert (server.statistics().refused_connections, server.statistics().requests) == (1, 0)


async def test_a_server_from_another_ca_is_not_trusted(pki: Pki, tmp_path: Path) -> None:
    """The client checks the server's certificate: an impostor's is refused by the client."""
    (tmp_path / "other").mkdir()
    impostor = Pki(tmp_path / "other").credentials("impostor")
    async with impostor.server("127.0.0.1") as server:
        with pytest.raises(StoreRefusedError, match="certificate not accepted"):
            async with pki.credentials("client").client("127.0.0.1", server.port):
                pass


async def test_a_server_certificate_for_another_name_is_not_trusted(pki: Pki) -> None:
    """The server's certificate must name the host the client dialled."""
    async with pki.credentials("server", "other.example").server("127.0.0.1") as server:
        with pytest.raises(StoreRefusedError, match="certificate not accepted"):
            async with pki.credentials("client").client("127.0.0.1", server.port):
                pass


def plain_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` over plain TCP; return what came back before the server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


@pytest.mark.parametrize(
    "data",
    [encode_preamble() + encode_request(Op.HELLO, 0, b""), b"\x16\x03\x01garbage" * 50],
    ids=["plain-client", "garbage"],
)
async def test_plain_tcp_to_a_tls_store_reaches_nothing(pki: Pki, data: bytes) -> None:
    """Our protocol in clear, or bytes that look like TLS and are not: refused, nothing read."""
    async with pki.credentials("server").server("127.0.0.1") as server:
        await server.store.set("secret", b"value")
        received = await anyio.to_thread.run_sync(plain_exchange, server.port, data)
        assert b"value" not in received
        assert server.statistics().refused_connections == 1
        assert server.statistics().requests == 0


async def test_tls_server_without_a_token_is_not_warned_about(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that checks client certificates is not open to anyone, even without a token."""
    async with pki.credentials("server").server("0.0.0.0"):
        pass
    assert not [r for r in caplog.records if "accepts any client" in r.getMessage()]


def test_tls_needs_all_three_files(pki: Pki) -> None:
    """cacert without cert and key is a configuration error naming what is missing."""
    with pytest.raises(ValueError, match="cert, key missing"):
        StoreCredentials.from_files(cacert=pki.cacert)


def test_an_unreadable_ca_file_is_named(tmp_path: Path) -> None:
    """A CA file that cannot be loaded is named in the error."""
    with pytest.raises(ValueError, match=r"no-ca\.pem"):
        server_context(tmp_path / "no-ca.pem", tmp_path / "c", tmp_path / "k")


def test_the_contexts_require_certificates_and_trust_only_the_job_ca(pki: Pki) -> None:
    """Both ends demand the other's certificate and trust the job's CA alone, not the system's."""
    cert, key = pki.node("server")
    server, client = server_context(pki.cacert, cert, key), client_context(pki.cacert, cert, key)
    assert (server.verify_mode, client.verify_mode) == (ssl.CERT_REQUIRED, ssl.CERT_REQUIRED)
    assert client.check_hostname
    assert len(server.get_ca_certs()) == len(client.get_ca_certs()) == 1


# -- the c10d backend over TLS ------------------------------------------------------------


def tls_conf(pki: Pki, name: str) -> dict[str, str]:
    cert, key = pki.node(name)
    return {"cacert": str(pki.cacert), "cert": str(cert), "key": str(key)}


async def test_c10d_nodes_with_certificates_form_a_world(pki: Pki) -> None:
    """cacert, cert and key in the rendezvous config: the round completes over TLS."""
    port = unused_port()
    handlers = [
        get_rendezvous_handler(
            RendezvousParameters("c10d", f"127.0.0.1:{port}", "job", 2, 2, **tls_conf(pki, n))
        )
        for n in ("a", "b")
    ]
    infos = await join_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1]


async def test_c10d_node_without_a_certificate_cannot_join(pki: Pki) -> None:
    """A node with no TLS cannot reach a TLS rendezvous store; one whose certificate is from
    another CA is refused at once, saying why."""
    port = unused_port()
    host = RendezvousParameters("c10d", f"127.0.0.1:{port}", "job", 1, 2, **tls_conf(pki, "a"))
    async with get_rendezvous_handler(host):
        intruder = RendezvousParameters(
            "c10d", f"127.0.0.1:{port}", "job", 1, 2, is_host="false", read_timeout="30"
        )
        with pytest.raises(RendezvousConnectionError, match=r"refused this node.*speaks in clear"):
            async with get_rendezvous_handler(intruder):
                pass
        stranger = {**tls_conf(Pki(pki.directory / "stranger"), "x"), "read_timeout": "30"}
        stranger_node = RendezvousParameters(
            "c10d", f"127.0.0.1:{port}", "job", 1, 2, is_host="false", **stranger
        )
        refused = "refused this node: TLS handshake failed"
        with pytest.raises(RendezvousConnectionError, match=refused):
            async with get_rendezvous_handler(stranger_node):
                pass


def test_c10d_tls_needs_all_three_keys(pki: Pki) -> None:
    """cacert alone is a parameter error naming the missing keys."""
    params = RendezvousParameters("c10d", "127.0.0.1:1", "job", 1, 1, cacert=str(pki.cacert))
    with pytest.raises(RendezvousParameterError, match="cert, key missing"):
        get_rendezvous_handler(params)


async def test_a_plain_client_of_a_tls_server_is_told_to_use_tls(pki: Pki) -> None:
    """A client without TLS learns at once that the server speaks TLS (not a retry loop)."""
    async with pki.credentials("server").server("127.0.0.1") as server:
        with pytest.raises(StoreRefusedError, match="the client speaks in clear"):
            async with TCPStore("127.0.0.1", server.port, connect_timeout=30):
                pass
