"""TLS contexts for the TCP store: both ends present certificates and check the other's.

The server requires a client certificate signed by ``cacert``; the client checks that the
server's certificate is signed by ``cacert`` and names the host it dialled. The same three
files serve both roles, as for etcd: give every node a certificate (and key) from the job's
CA, valid for the names or addresses other nodes use to reach it.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

PathLike = str | Path

TLS_FAILURES = (OSError, anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError)
"""What a failed TLS handshake raises (``ssl.SSLError`` is an ``OSError``)."""


def server_context(cacert: PathLike, cert: PathLike, key: PathLike) -> ssl.SSLContext:
    """A server context that presents ``cert`` and refuses clients without a valid one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = ssl.CERT_REQUIRED
    _load(context, cacert, cert, key)
    return context


def client_context(
    cacert: PathLike, cert: PathLike | None = None, key: PathLike | None = None
) -> ssl.SSLContext:
    """A client context that checks the server against ``cacert`` and presents ``cert``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the certificate and host name
    _load(context, cacert, cert, key)
    return context


def _load(
    context: ssl.SSLContext, cacert: PathLike, cert: PathLike | None, key: PathLike | None
) -> None:
    """Load the CA and the certificate chain; raise ``ValueError`` naming the file at fault.

    Only ``cacert`` is trusted: never the system's CAs, which would let any certificate a
    public CA ever issued into the job.
    """
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=str(cacert))
    except OSError as error:  # ssl.SSLError is one
        raise ValueError(f"cannot load the CA certificate {str(cacert)!r}: {_why(error)}") from None
    if cert is None:
        if key is not None:
            raise ValueError("a TLS key was given without its certificate; pass cert= too")
        return
    try:
        context.load_cert_chain(str(cert), None if key is None else str(key))
    except OSError as error:  # ssl.SSLError is one
        raise ValueError(
            f"cannot load the certificate {str(cert)!r} and key {str(key)!r}: {_why(error)}"
        ) from None


def _why(error: OSError) -> str:
    return str(getattr(error, "reason", None) or error.strerror or error)


async def wrap_server_stream(stream: anyio.abc.ByteStream, context: ssl.SSLContext) -> TLSStream:
    """Run the server side of the TLS handshake over ``stream`` (raises one of
    :data:`TLS_FAILURES` if the client fails it)."""
    return await TLSStream.wrap(
        stream, server_side=True, ssl_context=context, standard_compatible=False
    )


def tls_failure(error: BaseException) -> str:
    """Say in a few words why a TLS handshake failed."""
    cause = error.__cause__ if isinstance(error, anyio.BrokenResourceError) else error
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate not accepted: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause).lower().replace("_", " ")
    if isinstance(cause, anyio.EndOfStream | ConnectionError):
        return "the peer closed the connection during the handshake"
    if isinstance(cause, TimeoutError):
        return "no TLS handshake in time"
    return f"{type(cause).__name__}: {cause}" if cause is not None else type(error).__name__
