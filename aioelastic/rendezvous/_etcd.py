"""The ``etcd`` backend (aliases ``etcd-v3`` and torch's ``etcd-v2``): elastic rendezvous over
an etcd v3 cluster. ``etcd-v2`` is served by the v3 API too (we have no v2 client; a v3 etcd
serves both), which is said once per process.

A thin factory: the elastic handler of :mod:`._elastic` running over an
:class:`~aioelastic.store.EtcdStore`. Node liveness keys are TTL keys, that is etcd leases,
so a node whose process dies is dropped by etcd's clock when its lease expires.

``--rdzv-endpoint`` lists the members (``host:port[,host:port...]``, port 2379 by default).
``--rdzv-conf`` keys beyond the elastic ones (torch's names where torch has them):
``etcd_prefix`` (key prefix, default ``/aioelastic``), ``protocol`` (``http`` or ``https``),
``cacert``, ``cert``, ``key`` (PEM files; torch's ``etcd-v2`` names ``ca_cert``, ``ssl_cert``,
``ssl_cert_key`` are accepted for them), ``user`` and ``password`` (etcd authentication);
``read_timeout`` is how long the store keeps retrying an unreachable cluster before the
handler raises :class:`RendezvousConnectionError` (default 60 s). In-process callers may pass
an open ``EtcdStore`` as ``store`` so many handlers share one connection.

One attempt of a store call gives up after half the slack between a keep-alive and the
liveness key's expiry (at most 5 s), so a keep-alive stuck on a stalled member still reaches
another member before the node is taken for dead.
"""

from __future__ import annotations

import functools
import logging
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

TORCH_TLS_NAMES = {"ca_cert": "cacert", "ssl_cert": "cert", "ssl_cert_key": "key"}
"""torch's ``etcd-v2`` TLS keys and the names they stand for."""

logger = logging.getLogger(__name__)


@functools.cache
def _say_v2_is_v3() -> None:
    logger.warning(
        "rendezvous backend etcd-v2: served through etcd's v3 API (aioelastic has no v2 "
        "client); an etcd that serves v2 serves v3 too"
    )


def with_torch_tls_names(params: RendezvousParameters) -> RendezvousParameters:
    """``params`` with torch's TLS key names renamed to ours; both spellings at once is an error."""
    config = dict(params.config)
    for torch_name, ours in TORCH_TLS_NAMES.items():
        if torch_name in config:
            if ours in config:
                raise RendezvousParameterError(
                    f"rendezvous options {torch_name} and {ours} are the same setting; give one"
                )
            config[ours] = config.pop(torch_name)
    return RendezvousParameters(
        params.backend,
        params.endpoint,
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        **config,
    )


DEFAULT_ENDPOINT = "127.0.0.1:2379"
DEFAULT_READ_TIMEOUT = 60.0


def create_handler(params: RendezvousParameters) -> ElasticRendezvousHandler:
    """Create an ``etcd``/``etcd-v3``/``etcd-v2`` handler (the module docstring lists the keys)."""
    if params.backend == "etcd-v2":
        _say_v2_is_v3()
    params = with_torch_tls_names(params)
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
