"""``aioelastic status``: a job's rendezvous state, read from its store (TCP or etcd).

It opens the store the way the chosen backend's nodes do (as a client only: it never hosts
the c10d store), reads the run's keys once, and prints
:func:`aioelastic.rendezvous._status.format_status` (or JSON with ``--json``). It changes nothing
in the store.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from aioelastic._launcher.cli_run import parse_rdzv_conf

if TYPE_CHECKING:
    from aioelastic.rendezvous._status import RunStatus
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
            "round's participants (rank, node id, host, alive, seconds since the last heartbeat "
            "on the store's clock), the nodes waiting to join, "
            "nodes reported lost, and whether the run is closed."
        ),
    )
    add = parser.add_argument
    add("--rdzv-backend", default="c10d", choices=BACKENDS, help="the job's rendezvous backend")
    add("--rdzv-endpoint", default=None, help="HOST:PORT of the store (etcd: a list)")
    add("--rdzv-id", default="none", help="the job's run id")
    add(
        "--rdzv-conf",
        default={},
        type=parse_rdzv_conf,
        help="the job's rendezvous options that reach the store (etcd_prefix, cacert, user, ...)",
    )
    add("--timeout", default=10.0, type=float, help="seconds to wait for the store")
    add(
        "--timers",
        metavar="HOST:PORT",
        default=None,
        help="list the watchdog timers armed on the node whose `aioelastic run --metrics-port` "
        "is HOST:PORT (scope and seconds left), and the limits its workers' "
        'expires(after="auto") learned',
    )
    add(
        "--stacks",
        action="store_true",
        help="ask every node's agent (through the store) for its workers' Python stacks and "
        "print them grouped by where each rank is, with the suspects",
    )
    add("--json", action="store_true", help="print the state as one JSON object")
    parser.set_defaults(handler=status_command)
    return parser


def status_command(args: argparse.Namespace) -> int:
    """The ``aioelastic status`` handler: read, print, exit 0 (1 if a source is unreachable)."""
    import anyio

    from aioelastic.agent._status import format_learned, format_stacks, format_timers
    from aioelastic.events import to_data
    from aioelastic.rendezvous import RendezvousError
    from aioelastic.rendezvous._status import format_status, job_stragglers

    if args.rdzv_endpoint is None and args.timers is None:
        print(
            f"{PROG}: error: give --rdzv-endpoint (and --rdzv-id), --timers, or both",
            file=sys.stderr,
        )
        return 2
    if args.stacks and args.rdzv_endpoint is None:
        print(f"{PROG}: error: --stacks needs --rdzv-endpoint (and --rdzv-id)", file=sys.stderr)
        return 2
    report: dict[str, Any] = {}
    texts = []
    try:
        if args.rdzv_endpoint is not None:
            status = anyio.run(
                fetch_status,
                args.rdzv_backend,
                args.rdzv_endpoint,
                args.rdzv_id,
                args.rdzv_conf,
                args.timeout,
            )
            report.update(to_data(status))
            report["stragglers"] = {str(r): v for r, v in job_stragglers(status.step_times).items()}
            texts.append(format_status(status))
            if args.stacks:
                stacks = anyio.run(
                    fetch_stacks,
                    args.rdzv_backend,
                    args.rdzv_endpoint,
                    args.rdzv_id,
                    args.rdzv_conf,
                    args.timeout,
                )
                report["stacks"] = stacks
                texts.append(format_stacks(args.rdzv_id, stacks))
        if args.timers is not None:
            timers = fetch_timers(args.timers, args.timeout)
            report["timers"] = timers
            texts.append(format_timers(args.timers, timers))
            learned = fetch_json(args.timers, "learned", args.timeout)
            report["learned_timeouts"] = learned
            texts.append(format_learned(args.timers, learned))
    except (RendezvousError, OSError, ValueError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report) if args.json else "\n".join(texts))
    return 0


def fetch_timers(address: str, timeout: float) -> list[dict[str, Any]]:
    """The timers a node's metrics endpoint lists at ``/timers``."""
    timers = fetch_json(address, "timers", timeout)
    if not isinstance(timers, list):
        raise ValueError(
            f"http://{address}/timers did not list timers (got {type(timers).__name__})"
        )
    return timers


def fetch_json(address: str, what: str, timeout: float) -> Any:
    """What a node's metrics endpoint serves at ``/<what>``, decoded."""
    import urllib.error
    import urllib.request

    url = f"http://{address}/{what}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return json.loads(reply.read())
    except (OSError, ValueError) as error:
        raise OSError(
            f"cannot read the watchdog {what} at {url}: {error}; is `aioelastic run "
            "--metrics-port` serving there?"
        ) from None


async def fetch_status(
    backend: str, endpoint: str, run_id: str, conf: dict[str, str], timeout: float
) -> RunStatus:
    """Read run ``run_id``'s rendezvous keys from its store and decode them."""
    from aioelastic.agent._status import read_generations, read_preemption, read_step_times
    from aioelastic.rendezvous import RendezvousConnectionError
    from aioelastic.rendezvous import _layout as layout
    from aioelastic.rendezvous._status import read_status
    from aioelastic.store import PrefixStore, StoreError

    async with open_store(backend, endpoint, run_id, conf, timeout) as store:
        run = PrefixStore(f"rdzv/{run_id}", store)
        try:
            snapshot = await run.get_prefix("")
            ttl_left = await _liveness_ttls(run, layout.parse_alive(snapshot.items))
        except StoreError as error:
            raise RendezvousConnectionError(f"reading run {run_id!r} failed: {error}") from error
    status = read_status(run_id, snapshot.items, ttl_left)
    generations = read_generations(snapshot.items, status.round)
    steps = read_step_times(snapshot.items, status.round)
    preemption = read_preemption(snapshot.items, status.round)
    return dataclasses.replace(
        status, generations=generations, step_times=steps, preemption=preemption
    )


async def fetch_stacks(
    backend: str, endpoint: str, run_id: str, conf: dict[str, str], timeout: float
) -> dict[str, Any]:
    """Ask the agents of run ``run_id``'s last round for their workers' stacks (see
    :mod:`aioelastic.agent._stack_requests`); the grouped result as data."""
    from aioelastic.agent._stack_requests import request_stacks
    from aioelastic.agent._status import stacks_data
    from aioelastic.rendezvous import RendezvousConnectionError
    from aioelastic.rendezvous._status import read_status
    from aioelastic.store import PrefixStore, StoreError

    async with open_store(backend, endpoint, run_id, conf, timeout) as store:
        run = PrefixStore(f"rdzv/{run_id}", store)
        try:
            status = read_status(run_id, (await run.get_prefix("")).items)
            if not status.participants:
                raise ValueError(f"run {run_id!r} has no round with workers to ask")
            round_store = PrefixStore(f"store/{status.round}", run)
            answers, silent = await request_stacks(
                round_store, nodes=len(status.participants), timeout=timeout
            )
        except StoreError as error:
            raise RendezvousConnectionError(f"asking run {run_id!r} failed: {error}") from error
    return stacks_data(answers, silent)


async def _liveness_ttls(run: Store, nodes: Iterable[int]) -> dict[int, float]:
    """The seconds each node's liveness key has left, on the store's clock (what it can say)."""
    from aioelastic.rendezvous import _layout as layout

    left: dict[int, float] = {}
    for node in nodes:
        try:
            remaining = await run.ttl_remaining(layout.alive_key(node))
        except NotImplementedError:
            return {}
        if remaining is not None:
            left[node] = remaining
    return left


@asynccontextmanager
async def open_store(
    backend: str, endpoint: str, run_id: str, conf: dict[str, str], timeout: float
) -> AsyncIterator[Store]:
    """Open the store of ``backend`` as its nodes do, as a client only."""
    from aioelastic.rendezvous import RendezvousConnectionError, RendezvousParameters
    from aioelastic.store import StoreError

    if backend == "c10d":
        from aioelastic.rendezvous._c10d import open_tcp_store, parse_endpoint
        from aioelastic.rendezvous._security import store_credentials

        host, port = parse_endpoint(endpoint)
        credentials = store_credentials(
            RendezvousParameters(backend, endpoint, run_id, 1, 1, **conf)
        )
        async with open_tcp_store(
            host,
            port,
            is_host=False,
            read_timeout=timeout,
            connect_timeout=timeout,
            credentials=credentials,
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
