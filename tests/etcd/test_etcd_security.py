"""EtcdStore with TLS (client certificates) and with etcd's user/password authentication."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import grpc
import pytest
from aetcd import rpc

from aioelastic.rendezvous import RendezvousHandler, RendezvousParameters, get_rendezvous_handler
from aioelastic.store import EtcdStore, StoreConnectionError, StoreRefusedError
from aioelastic.testing import EtcdCluster
from tests.etcd_fixtures import start_cluster

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.etcd,
    pytest.mark.parametrize("anyio_backend", [("asyncio", {})], ids=["asyncio"]),
]

PASSWORD = "s3cret-for-tests"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(name: str, usage: str, cwd: Path) -> None:
    """Write ``name.key``/``name.pem``: a certificate for 127.0.0.1 signed by ``ca.pem``."""
    (cwd / f"{name}.ext").write_text(f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
             "-extfile", f"{name}.ext", cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA with a server and a client certificate for 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    cwd = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca", cwd=cwd)  # fmt: skip
    _issue("server", "serverAuth,clientAuth", cwd)
    _issue("client", "clientAuth", cwd)
    return cwd


@pytest.fixture(scope="module")
def tls_etcd(
    etcd_binary: str, certificates: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EtcdCluster]:
    """An etcd member that serves clients over TLS and requires a client certificate."""
    pki = certificates
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes(),
        certificate_chain=(pki / "client.pem").read_bytes(),
    )
    args = ["--cert-file", str(pki / "server.pem"), "--key-file", str(pki / "server.key"),
            "--trusted-ca-file", str(pki / "ca.pem"), "--client-cert-auth"]  # fmt: skip
    base = tmp_path_factory.mktemp("etcd-tls")
    cluster = start_cluster(etcd_binary, base, 1, extra_args=args, credentials=credentials)
    yield cluster
    cluster.stop(timeout=1)


@pytest.fixture(scope="module")
def auth_etcd(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """An etcd member with authentication on and a root user whose password is PASSWORD."""
    cluster = start_cluster(etcd_binary, tmp_path_factory.mktemp("etcd-auth"), 1)
    with grpc.insecure_channel(cluster.endpoints) as channel:
        auth = rpc.AuthStub(channel)
        auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=PASSWORD), timeout=10)
        auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        auth.AuthEnable(rpc.AuthEnableRequest(), timeout=10)
    yield cluster
    cluster.stop(timeout=1)


async def test_tls_with_a_client_certificate(
    tls_etcd: EtcdCluster, certificates: Path, etcd_prefix: str
) -> None:
    """With the CA, a client cert and its key, the store works over TLS."""
    pki = certificates
    async with EtcdStore(
        f"https://{tls_etcd.endpoints}",
        prefix=etcd_prefix,
        ca_cert=pki / "ca.pem",
        cert=pki / "client.pem",
        key=pki / "client.key",
    ) as store:
        await store.set("k", b"over tls")
        assert await store.get("k") == b"over tls"
        assert await store.add("n", 2) == 2


async def test_tls_without_a_client_certificate_cannot_connect(
    tls_etcd: EtcdCluster, certificates: Path, etcd_prefix: str
) -> None:
    """A member that requires client certificates refuses a client without one."""
    store = EtcdStore(
        tls_etcd.endpoints, prefix=etcd_prefix, ca_cert=certificates / "ca.pem", retry_timeout=1
    )
    with pytest.raises(StoreConnectionError, match="failed on every endpoint for 1 s"):
        async with store:
            pass


async def test_password_authentication(auth_etcd: EtcdCluster, etcd_prefix: str) -> None:
    """The right user and password get a token; the store works."""
    endpoints = auth_etcd.endpoints
    async with EtcdStore(endpoints, prefix=etcd_prefix, user="root", password=PASSWORD) as store:
        await store.set("k", b"authenticated")
        assert await store.compare_set("k", b"authenticated", b"swapped") == b"swapped"


async def test_wrong_password_is_refused_naming_the_user(
    auth_etcd: EtcdCluster, etcd_prefix: str
) -> None:
    """A wrong password raises StoreRefusedError naming the user and what to check."""
    store = EtcdStore(auth_etcd.endpoints, prefix=etcd_prefix, user="root", password="wrong")
    with pytest.raises(StoreRefusedError, match=r"refused user 'root'.*check the user name"):
        async with store:
            pass


async def test_no_credentials_on_an_auth_cluster_is_refused(
    auth_etcd: EtcdCluster, etcd_prefix: str
) -> None:
    """Without a user, an etcd with authentication on refuses the store's requests."""
    async with EtcdStore(auth_etcd.endpoints, prefix=etcd_prefix, retry_timeout=1) as store:
        with pytest.raises(StoreRefusedError, match="user name and password are required"):
            await store.set("k", b"anonymous")


@pytest.mark.parametrize(
    ("backend", "names"),
    [("etcd", ("cacert", "cert", "key")), ("etcd-v2", ("ca_cert", "ssl_cert", "ssl_cert_key"))],
    ids=["ours", "torch-etcd-v2"],
)
async def test_rendezvous_over_tls_from_rdzv_conf(
    tls_etcd: EtcdCluster, certificates: Path, backend: str, names: tuple[str, str, str]
) -> None:
    """The etcd backend takes protocol and the TLS files from its config (strings, as
    --rdzv-conf gives them; torch's etcd-v2 key names too) and forms a round over TLS."""
    pki = certificates
    files = (str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client.key"))
    params = RendezvousParameters(
        backend,
        tls_etcd.endpoints,
        f"tls-job-{backend}",
        2,
        2,
        local_addr="127.0.0.1",
        protocol="https",
        **dict(zip(names, files, strict=True)),
    )
    handlers = [get_rendezvous_handler(params) for _ in range(2)]
    ranks: list[int] = []

    async def join(handler: RendezvousHandler) -> None:
        ranks.append((await handler.next_rendezvous()).rank)

    async with handlers[0], handlers[1], anyio.create_task_group() as tg:
        for handler in handlers:
            tg.start_soon(join, handler)
    assert sorted(ranks) == [0, 1]
