"""``aioelastic status``: a job's rendezvous state, read from its store (TCP or etcd).

It opens the store the way the chosen backend's nodes do (as a client only: it never hosts
the c10d store), reads the run's keys once, and prints :func:`aioelastic._status.format_status`
(or JSON with ``--json``). It changes nothing in the store.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from aioelastic.agent._cli import parse_rdzv_conf

if TYPE_CHECKING:
    from aioelastic._status import RunStatus
    from aioelastic.store import Store

PROG = "aioelastic status"
BACKENDS = ("c10d", "etcd", "etcd-v3")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``status`` to the ``aioelastic`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status",
        help="show a job's rendezvous state as its store knows it",
        description=(
            "Read the rendezvous keys of run --rdzv-id from its store and print the last "
            "round's participants (rank, node id, host, alive), the nodes waiting to join, "
            "nodes reported lost, and whether the run is closed."
        ),
    )
    add = parser.add_argument
    add("--rdzv-backend", default="c10d", choices=BACKENDS, help="the job's rendezvous backend")
    add("--rdzv-endpoint", required=True, help="HOST:PORT of the store (etcd: a list)")
    add("--rdzv-id", required=True, help="the job's run id")
    add(
        "--rdzv-conf",
        default={},
        type=parse_rdzv_conf,
        help="the job's rendezvous options that reach the store (etcd_prefix, cacert, user, ...)",
    )
    add("--timeout", default=10.0, type=float, help="seconds to wait for the store")
    add("--json", action="store_true", help="print the state as one JSON object")
    parser.set_defaults(handler=status_command)
    return parser


def status_command(args: argparse.Namespace) -> int:
    """The ``aioelastic status`` handler: read, print, exit 0 (1 if the store is unreachable)."""
    import anyio

    from aioelastic._status import format_status
    from aioelastic.events import to_data
    from aioelastic.rendezvous import RendezvousError

    try:
        status = anyio.run(
            fetch_status,
            args.rdzv_backend,
            args.rdzv_endpoint,
            args.rdzv_id,
            args.rdzv_conf,
            args.timeout,
        )
    except RendezvousError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(to_data(status)) if args.json else format_status(status))
    return 0


async def fetch_status(
    backend: str, endpoint: str, run_id: str, conf: dict[str, str], timeout: float
) -> RunStatus:
    """Read run ``run_id``'s rendezvous keys from its store and decode them."""
    from aioelastic._status import read_status
    from aioelastic.rendezvous import RendezvousConnectionError
    from aioelastic.store import PrefixStore, StoreError

    async with open_store(backend, endpoint, run_id, conf, timeout) as store:
        try:
            snapshot = await PrefixStore(f"rdzv/{run_id}", store).get_prefix("")
        except StoreError as error:
            raise RendezvousConnectionError(f"reading run {run_id!r} failed: {error}") from error
    return read_status(run_id, snapshot.items)


@asynccontextmanager
async def open_store(
    backend: str, endpoint: str, run_id: str, conf: dict[str, str], timeout: float
) -> AsyncIterator[Store]:
    """Open the store of ``backend`` as its nodes do, as a client only."""
    from aioelastic.rendezvous import RendezvousConnectionError, RendezvousParameters
    from aioelastic.store import StoreError

    if backend == "c10d":
        from aioelastic.rendezvous._c10d import open_tcp_store, parse_endpoint

        host, port = parse_endpoint(endpoint)
        async with open_tcp_store(
            host, port, is_host=False, read_timeout=timeout, connect_timeout=timeout
        ) as store:
            yield store
        return
    from aioelastic.rendezvous._etcd import _open_store

    conf = {**conf, "read_timeout": str(timeout)}
    etcd = _open_store(RendezvousParameters(backend, endpoint, run_id, 1, 1, **conf))
    try:
        async with etcd:
            yield etcd
    except StoreError as error:
        raise RendezvousConnectionError(f"cannot read etcd at {endpoint}: {error}") from error
