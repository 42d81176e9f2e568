"""The ``c10d`` backend: elastic rendezvous over the TCP store.

The node whose endpoint is local (a loopback or interface address of this host, its
``--local-addr``, or its name) hosts the store server (or the node with ``is_host=true``);
every node, the host included, talks to it as a client. When another process on the same host
already serves the endpoint, a node that was not told ``is_host`` simply becomes a client.

``token_file`` (or ``$AIOELASTIC_STORE_TOKEN_FILE``) secures the store: see :mod:`._security`.
The node that hosts the store leaves last: on leaving it waits, at most ``host_leave_timeout``
seconds (default 30), until every participant read the end (see :mod:`._ending`).
"""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._ending import DEFAULT_HOST_LEAVE_TIMEOUT, Hosting
from aioelastic.rendezvous._errors import RendezvousConnectionError, RendezvousParameterError
from aioelastic.rendezvous._local import endpoint_is_local
from aioelastic.rendezvous._parameters import ElasticSettings, RendezvousParameters
from aioelastic.rendezvous._security import SECURITY_KEYS, store_credentials
from aioelastic.store import Store, StoreError, StoreRefusedError
from aioelastic.store._credentials import StoreCredentials

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29400


def parse_endpoint(endpoint: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Split ``host[:port]`` (IPv6 as ``[addr]:port``) into host and port."""
    text = endpoint.strip()
    if not text:
        raise RendezvousParameterError(
            "the rendezvous endpoint is empty; pass host[:port] of the rendezvous store"
        )
    host, port_text = text, ""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise RendezvousParameterError(
                f"rendezvous endpoint {endpoint!r} is malformed; write an IPv6 address as "
                "[addr]:port, for example [::1]:29400"
            )
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise RendezvousParameterError(
            f"rendezvous endpoint {endpoint!r} has no host; pass host:port of the rendezvous "
            "store (for this machine, 127.0.0.1 or its name)"
        )
    if not port_text:
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise RendezvousParameterError(
            f"rendezvous endpoint {endpoint!r} has port {port_text!r}; use host:port with a "
            "port in 1..65535"
        )
    return host, port


LOCAL_STORE_ANSWER_TIMEOUT = 5.0
"""Seconds a store that another process of this host serves at the endpoint may take to answer
a first connection: a program that does not answer as one holds the port, and the node says so
at once instead of trying to reach a store there for its whole read timeout."""


def _cannot_serve(bind: str, port: int, error: object) -> str:
    return (
        f"cannot serve the rendezvous store on {bind}:{port}: {error}; free the port or choose "
        "another endpoint"
    )


async def _answers_as_store(credentials: StoreCredentials, host: str, port: int) -> bool:
    """Whether what listens at ``host:port`` is a store (one that refuses this node counts:
    connecting for real says why)."""
    within = LOCAL_STORE_ANSWER_TIMEOUT
    probe = credentials.client(
        host, port, timeout=within, connect_timeout=within, request_timeout=within
    )
    try:
        async with probe:
            return True
    except StoreRefusedError:
        return True
    except StoreError:
        return False


@asynccontextmanager
async def open_tcp_store(
    host: str,
    port: int,
    *,
    is_host: bool | None,
    read_timeout: float,
    connect_timeout: float,
    credentials: StoreCredentials | None = None,
    request_timeout: float | None = None,
    local_addr: str | None = None,
    hosting: Hosting | None = None,
) -> AsyncIterator[Store]:
    """Serve the store if this node hosts it, and connect to it; yields the client.

    ``credentials`` (a token, see :mod:`._security`) are required of clients by the server
    this node hosts and presented by its own client. ``hosting.here`` is set when this node
    serves the store.
    """
    credentials = credentials or StoreCredentials()
    async with AsyncExitStack() as stack:
        if is_host or (is_host is None and await endpoint_is_local(host, local_addr)):
            bind = host if host in ("127.0.0.1", "localhost", "::1") else "0.0.0.0"
            try:
                server = credentials.server(bind, port)
            except ValueError as error:  # require_auth without a token
                raise RendezvousParameterError(str(error)) from None
            try:
                await stack.enter_async_context(server)
            except OSError as error:
                if is_host or error.errno != errno.EADDRINUSE:
                    raise RendezvousConnectionError(_cannot_serve(bind, port, error)) from error
                if not await _answers_as_store(credentials, host, port):
                    why = (
                        f"{error} (by a program that did not answer as a rendezvous store within "
                        f"{LOCAL_STORE_ANSWER_TIMEOUT:g} s)"
                    )
                    raise RendezvousConnectionError(_cannot_serve(bind, port, why)) from error
                logger.info(
                    "%s:%d is served by another process here; joining as a client", host, port
                )
            else:
                if hosting is not None:
                    hosting.here = True
        client = credentials.client(
            host,
            port,
            timeout=read_timeout,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
        )
        try:
            await stack.enter_async_context(client)
        except StoreRefusedError as error:
            raise RendezvousConnectionError(
                f"the rendezvous store at {host}:{port} refused this node: "
                f"{error.reason.removeprefix('refused the connection: ')}"
            ) from error
        except StoreError as error:
            raise RendezvousConnectionError(
                f"cannot reach the rendezvous store at {host}:{port} within "
                f"{connect_timeout:g} s: {error}; check the endpoint and that the hosting node "
                "is up"
            ) from error
        yield client


def create_handler(params: RendezvousParameters) -> ElasticRendezvousHandler:
    """Create a ``c10d`` handler (see the module docstring)."""
    settings = ElasticSettings.from_parameters(
        params, extra_keys={"is_host", "store_type", "host_leave_timeout", *SECURITY_KEYS}
    )
    store_type = str(params.get("store_type", "tcp")).strip().lower()
    if store_type != "tcp":
        raise RendezvousParameterError(
            f"rendezvous option store_type={store_type!r} is not supported; only 'tcp' is"
        )
    is_host = params.get_as_bool("is_host")
    leave = params.get_as_float("host_leave_timeout", DEFAULT_HOST_LEAVE_TIMEOUT)
    assert leave is not None  # a default was given
    if leave < 0:
        raise RendezvousParameterError(
            f"rendezvous option host_leave_timeout={leave:g} must be >= 0 seconds (0: the "
            "store's host leaves without waiting for the others to read the end)"
        )
    hosting = Hosting(leave)
    host, port = parse_endpoint(params.endpoint)
    local_addr = params.local_addr or params.get("local_addr")
    opener = functools.partial(
        open_tcp_store,
        host,
        port,
        is_host=is_host,
        read_timeout=settings.read_timeout,
        connect_timeout=settings.read_timeout,  # as torch: read_timeout bounds connecting too
        credentials=store_credentials(params),
        request_timeout=settings.attempt_timeout,  # a partitioned connection is replaced
        local_addr=local_addr,
        hosting=hosting,
    )
    return ElasticRendezvousHandler(
        opener, settings, backend="c10d", local_addr=local_addr, hosting=hosting
    )
