"""``aioelastic store-server``: run a TCP store server until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from aioelastic.store._auth import TOKEN_FILE_ENV
from aioelastic.store._credentials import StoreCredentials

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
        default=os.environ.get(TOKEN_FILE_ENV) or None,
        help="file holding a shared token that clients must prove they hold (surrounding "
        f"whitespace is ignored; default: ${TOKEN_FILE_ENV}); strongly advised when binding a "
        "non-loopback address",
    )
    for name, what in (
        ("cacert", "the CA certificate that clients' certificates must be signed by"),
        ("cert", "this server's certificate (PEM)"),
        ("key", "this server's private key (PEM)"),
    ):
        parser.add_argument(f"--{name}", type=Path, help=f"TLS: {what}; give all three")
    parser.add_argument(
        "--require-auth",
        action="store_true",
        help="refuse to start on a non-loopback address with neither a token nor TLS",
    )
    parser.set_defaults(handler=run)


async def serve(host: str, port: int, credentials: StoreCredentials) -> None:
    """Serve until SIGINT or SIGTERM arrives."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with credentials.server(host, port) as server:
            print(READY_LINE.format(host=host, port=server.port), flush=True)
            async for _ in signals:
                return


def run(args: argparse.Namespace) -> int:
    """Run the server described by ``args``; return the exit status."""
    try:
        credentials = StoreCredentials.from_files(
            token_file=args.token_file,
            cacert=args.cacert,
            cert=args.cert,
            key=args.key,
            require_auth=args.require_auth,
        )
        # On uvloop when installed, as ``aioelastic run``: half the CPU per request.
        use_uvloop = importlib.util.find_spec("uvloop") is not None
        anyio.run(
            serve, args.host, args.port, credentials, backend_options={"use_uvloop": use_uvloop}
        )
    except ValueError as error:  # unusable token or TLS files, or require_auth without either
        print(f"aioelastic store-server: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(
            f"aioelastic store-server: cannot listen on {args.host}:{args.port}: {error.strerror}",
            file=sys.stderr,
        )
        return 1
    return 0
