"""Which torch store arrangement ``aioelastic run`` picks: torchrun's, unless a token or TLS
protects the job's store (torch's clients can send neither) or the job has one node."""

from __future__ import annotations

import pytest

from aioelastic.agent._worker_store import torch_store_arrangement
from aioelastic.rendezvous import RendezvousParameters
from aioelastic.store._auth import TOKEN_FILE_ENV


def params(backend: str, **conf: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend=backend, endpoint="127.0.0.1:29400", run_id="job", min_nodes=1, max_nodes=2, **conf
    )


@pytest.mark.parametrize(
    ("backend", "conf", "expected"),
    [
        ("static", {}, "expose"),
        ("c10d", {}, "expose"),
        ("etcd", {}, "expose"),
        ("memory", {}, "loopback"),
        ("static", {"token_file": "/t"}, "loopback"),
        ("c10d", {"token_file": "/t"}, "loopback"),
        ("c10d", {"cacert": "/ca", "cert": "/c", "key": "/k"}, "loopback"),
        ("etcd", {"protocol": "https"}, "loopback"),
        ("etcd", {"ca_cert": "/ca"}, "loopback"),
        ("etcd", {"user": "root", "password": "pw"}, "loopback"),
    ],
)
def test_auto_is_torchruns_where_the_store_is_open(
    backend: str, conf: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exposed where nothing protects the job's store; loopback behind a token or TLS."""
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert torch_store_arrangement("auto", params(backend, **conf)) == expected


def test_a_token_file_from_the_environment_protects_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The token file named by the environment counts as the token_file option does."""
    monkeypatch.setenv(TOKEN_FILE_ENV, "/t")
    assert torch_store_arrangement("auto", params("c10d")) == "loopback"


@pytest.mark.parametrize("mode", ["expose", "loopback"])
def test_a_chosen_arrangement_is_kept(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """--expose-torch-store and --loopback-torch-store win over the default."""
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert torch_store_arrangement(mode, params("c10d", token_file="/t")) == mode
    assert torch_store_arrangement(mode, params("memory")) == mode
