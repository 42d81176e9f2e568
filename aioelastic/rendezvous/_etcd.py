"""The ``etcd`` backend (alias ``etcd-v3``): elastic rendezvous over an etcd v3 cluster.

A thin factory: the elastic handler of :mod:`._elastic` running over an
:class:`~aioelastic.store.EtcdStore`. Node liveness keys are TTL keys, that is etcd leases,
so a node whose process dies is dropped by etcd's clock when its lease expires.

``--rdzv-endpoint`` lists the members (``host:port[,host:port...]``, port 2379 by default).
``--rdzv-conf`` keys beyond the elastic ones (torch's names where torch has them):
``etcd_prefix`` (key prefix, default ``/aioelastic``), ``protocol`` (``http`` or ``https``),
``cacert``, ``cert``, ``key`` (PEM files), ``user`` and ``password`` (etcd authentication);
``read_timeout`` is how long the store keeps retrying an unreachable cluster before the
handler raises :class:`RendezvousConnectionError` (default 60 s). In-process callers may pass
an open ``EtcdStore`` as ``store`` so many handlers share one connection.

One attempt of a store call gives up after half the slack between a keep-alive and the
liveness key's expiry (at most 5 s), so a keep-alive stuck on a stalled member still reaches
another member before the node is taken for dead.
"""

from __future__ import annotations

from typing import Any

from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._errors import RendezvousParameterError
from aioelastic.rendezvous._parameters import (
    MAX_ATTEMPT_TIMEOUT,
    ElasticSettings,
    RendezvousParameters,
)

ETCD_KEYS = frozenset({"etcd_prefix", "protocol", "cacert", "cert", "key", "user", "password"})
"""Config keys of the etcd backend (besides the elastic ones and ``store``)."""

DEFAULT_ENDPOINT = "127.0.0.1:2379"
DEFAULT_READ_TIMEOUT = 60.0


def create_handler(params: RendezvousParameters) -> ElasticRendezvousHandler:
    """Create an ``etcd``/``etcd-v3`` handler (see the module docstring for the config keys)."""
    settings = ElasticSettings.from_parameters(params, extra_keys=ETCD_KEYS | {"store"})
    shared = params.get("store")
    local_addr = params.local_addr or params.get("local_addr")
    if shared is not None:
        from aioelastic.store import EtcdStore

        if not isinstance(shared, EtcdStore):
            raise RendezvousParameterError(
                f"rendezvous option store={shared!r} is not an EtcdStore; the {params.backend} "
                "backend shares only an open EtcdStore"
            )
        return ElasticRendezvousHandler(
            shared, settings, backend=params.backend, local_addr=local_addr
        )
    store = _open_store(params, settings)
    return ElasticRendezvousHandler(
        lambda: store, settings, backend=params.backend, local_addr=local_addr
    )


def _open_store(params: RendezvousParameters, settings: ElasticSettings | None = None) -> Any:
    """Build (not yet connect) the EtcdStore a handler with ``settings`` will own (without
    settings, for a reader such as ``aioelastic status``: the longest attempt timeout)."""
    protocol = str(params.get("protocol", "http")).lower()
    if protocol not in ("http", "https"):
        raise RendezvousParameterError(
            f"rendezvous option protocol={protocol!r} must be http or https"
        )
    endpoints = params.endpoint or DEFAULT_ENDPOINT
    if protocol == "https":
        endpoints = ",".join(
            e if "://" in e else f"https://{e.strip()}" for e in endpoints.split(",")
        )
    prefix = str(params.get("etcd_prefix", "/aioelastic")).rstrip("/") + "/"
    read_timeout = params.get_as_float("read_timeout", DEFAULT_READ_TIMEOUT)
    assert read_timeout is not None  # a default was given
    if read_timeout <= 0:
        raise RendezvousParameterError(
            f"rendezvous option read_timeout={read_timeout:g} must be a positive number of seconds"
        )
    try:
        from aioelastic.store import EtcdStore

        return EtcdStore(
            endpoints,
            prefix=prefix,
            ca_cert=params.get("cacert"),
            cert=params.get("cert"),
            key=params.get("key"),
            user=params.get("user"),
            password=params.get("password"),
            request_timeout=MAX_ATTEMPT_TIMEOUT if settings is None else settings.attempt_timeout,
            retry_timeout=read_timeout,
        )
    except ImportError as error:
        raise RendezvousParameterError(
            f"the {params.backend} rendezvous backend needs the etcd client: {error}"
        ) from error
    except ValueError as error:
        raise RendezvousParameterError(
            f"bad {params.backend} rendezvous configuration: {error}"
        ) from error
