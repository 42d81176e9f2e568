"""``aioelastic store-server``: run a TCP store server until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from aioelastic.store._tcp_server import TCPStoreServer

DEFAULT_PORT = 29400
"""The port torchrun's c10d rendezvous uses by default."""

READY_LINE = "aioelastic store server listening on {host}:{port}"
"""Printed (and flushed) on stdout once the server accepts connections."""


def add_parser(subparsers: Any) -> None:
    """Add the ``store-server`` subcommand to the ``aioelastic`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "store-server",
        help="run a TCP key-value store server",
        description="Serve an aioelastic TCP store until interrupted (SIGINT or SIGTERM).",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s, loopback)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port to bind, 0 for any free one"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help="file holding a shared token that clients must present (surrounding whitespace "
        "is ignored); strongly advised when binding a non-loopback address",
    )
    parser.set_defaults(handler=run)


def read_token(path: Path) -> bytes:
    """Return the token in ``path``; raise ``ValueError`` saying why if it is unusable."""
    try:
        token = path.read_bytes().strip()
    except OSError as error:
        raise ValueError(f"cannot read the token file {str(path)!r}: {error.strerror}") from None
    if not token:
        raise ValueError(f"the token file {str(path)!r} is empty; put a secret in it")
    return token


async def serve(host: str, port: int, token: bytes | None) -> None:
    """Serve until SIGINT or SIGTERM arrives."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with TCPStoreServer(host, port, token=token) as server:
            print(READY_LINE.format(host=host, port=server.port), flush=True)
            async for _ in signals:
                return


def run(args: argparse.Namespace) -> int:
    """Run the server described by ``args``; return the exit status."""
    token = None
    if args.token_file is not None:
        try:
            token = read_token(args.token_file)
        except ValueError as error:
            print(f"aioelastic store-server: {error}", file=sys.stderr)
            return 2
    try:
        anyio.run(serve, args.host, args.port, token)
    except OSError as error:
        print(
            f"aioelastic store-server: cannot listen on {args.host}:{args.port}: {error.strerror}",
            file=sys.stderr,
        )
        return 1
    return 0
