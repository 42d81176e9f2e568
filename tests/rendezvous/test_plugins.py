"""Rendezvous backends plugged in through torch's ``torchrun.handlers`` entry points."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from aioelastic.rendezvous import (
    RendezvousParameterError,
    RendezvousParameters,
    get_rendezvous_handler,
)

PLUGIN = '''
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import MemoryStore


def elastic_creator():
    """What torch's entry point loads: a function returning the creator."""

    def create(params):
        settings = ElasticSettings.from_parameters(params)
        return ElasticRendezvousHandler(MemoryStore(), settings, backend=params.backend)

    return create


def torch_style_creator():
    return lambda params: object()


def broken_creator():
    raise RuntimeError("the plug-in's own bug")
'''


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed distribution whose torchrun.handlers entry points name three creators."""
    (tmp_path / "rdzv_plugin.py").write_text(PLUGIN)
    info = tmp_path / "rdzv_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rdzv-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [torchrun.handlers]
            plugged = rdzv_plugin:elastic_creator
            torchish = rdzv_plugin:torch_style_creator
            broken = rdzv_plugin:broken_creator
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def params(backend: str) -> RendezvousParameters:
    return RendezvousParameters(backend, "", "plugin-job", 1, 1)


@pytest.mark.usefixtures("plugins")
def test_a_backend_is_found_by_its_entry_point_name() -> None:
    """An unknown backend name is looked up in torchrun.handlers, as torch does."""
    handler = get_rendezvous_handler(params("plugged"))
    assert handler.get_backend() == "plugged"


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("torchish", "returned object, not an aioelastic.rendezvous.RendezvousHandler"),
        ("broken", "from entry point rdzv_plugin:broken_creator failed to load: RuntimeError"),
        ("nowhere", "unknown rendezvous backend 'nowhere'"),
    ],
)
def test_a_plugin_that_cannot_serve_is_named_in_the_error(backend: str, message: str) -> None:
    """A torch (synchronous) handler, a failing plug-in or no plug-in: one clear error."""
    with pytest.raises(RendezvousParameterError, match=message):
        get_rendezvous_handler(params(backend))
