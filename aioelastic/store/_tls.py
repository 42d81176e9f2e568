"""TLS contexts for the TCP store: both ends present certificates and check the other's.

The server requires a client certificate signed by ``cacert``; the client checks that the
server's certificate is signed by ``cacert`` and names the host it dialled. The same three
files serve both roles, as for etcd: give every node a certificate (and key) from the job's
CA, valid for the names or addresses other nodes use to reach it.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

PathLike = str | Path


class NotTLSError(Exception):
    """The client's first bytes are not a TLS handshake (it speaks in clear)."""

    def __init__(self, first: bytes) -> None:
        super().__init__("the client did not start a TLS handshake")
        self.first = first


TLS_FAILURES = (OSError, anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, NotTLSError)
"""What a failed TLS handshake raises (``ssl.SSLError`` is an ``OSError``)."""

_TLS_HANDSHAKE_RECORD = 0x16


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
    """Run the server side of the TLS handshake over ``stream``; raise one of
    :data:`TLS_FAILURES` if the client fails it.

    Unlike ``TLSStream.wrap``, a failed handshake still sends the alert OpenSSL wrote (say,
    "certificate required"), so a refused client learns why at once instead of seeing a bare
    close it would retry. A client that does not start TLS at all raises :class:`NotTLSError`
    with its first bytes, so the server can answer it in clear.
    """
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    first = await stream.receive()
    if first[0] != _TLS_HANDSHAKE_RECORD:
        raise NotTLSError(first)
    incoming.write(first)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if pending := outgoing.read():
                await stream.send(pending)
            try:
                incoming.write(await stream.receive())
            except anyio.EndOfStream:
                incoming.write_eof()
        except ssl.SSLError:
            if alert := outgoing.read():
                with contextlib.suppress(*TLS_FAILURES):
                    await stream.send(alert)
            raise
    if pending := outgoing.read():
        await stream.send(pending)
    # TLSStream has no public initializer for a finished handshake; its fields are these.
    return TLSStream(stream, False, tls, incoming, outgoing)


def tls_failure(error: BaseException) -> str:
    """Say in a few words why a TLS handshake failed."""
    cause = error.__cause__ if isinstance(error, anyio.BrokenResourceError) else error
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate not accepted: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause).lower().replace("_", " ")
    if isinstance(cause, anyio.EndOfStream | ConnectionError):
        return "the peer closed the connection during the handshake"
    if isinstance(cause, NotTLSError):
        return "the client speaks in clear; give it the job's cacert, cert and key"
    if isinstance(cause, TimeoutError):
        return "no TLS handshake in time"
    return f"{type(cause).__name__}: {cause}" if cause is not None else type(error).__name__
