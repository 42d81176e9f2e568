"""Rendezvous benchmarks: aioelastic's elastic rendezvous against torch's c10d, same run.

* formation time with N = 2, 4, 8, 16 separate processes over the TCP store (``c10d``), ours
  against torch's ``c10d`` dynamic rendezvous (and both static backends at N = 8);
* N = 100 and 1,000 handlers in one process, over one MemoryStore and over one TCP store
  (one server, one shared client);
* store operations per round as N grows (counted by a wrapper around the store).

Formation time runs from the moment every node has its handler ready (connected) and is told
to go, to the moment the last node's ``next_rendezvous()`` returned; processes compare
``time.monotonic()``, which is one clock for the whole machine. min_nodes = max_nodes = N, so
a round completes when the last node joins (no last-call wait in either implementation).
Each figure is the median of ``--repeat`` runs on fresh run ids. The machine is shared and
has 2 cores: figures are noisy. Run ``python -m bench.rendezvous``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import math
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio

from aioelastic.store import Snapshot, Store, Value

T = TypeVar("T")
TARGETS = {16: 0.050, 1000: 1.0}  # seconds, from issue 4


class CountingStore(Store):
    """Forwards to ``store`` and counts the operations by name."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.timeout = store.timeout
        self.counts: Counter[str] = Counter()

    @property
    def endpoint(self) -> str:
        return self.store.endpoint

    def _count(self, name: str, call: Awaitable[T]) -> Awaitable[T]:
        self.counts[name] += 1
        return call

    async def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        await self._count("set", self.store.set(key, value, ttl=ttl))

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        return await self._count("get", self.store.get(key, timeout=timeout))

    async def add(self, key: str, amount: int) -> int:
        return await self._count("add", self.store.add(key, amount))

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return await self._count("compare_set", self.store.compare_set(key, expected, desired))

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self._count("wait", self.store.wait(keys, timeout=timeout))

    async def check(self, keys: Sequence[str]) -> bool:
        return await self._count("check", self.store.check(keys))

    async def delete_key(self, key: str) -> bool:
        return await self._count("delete_key", self.store.delete_key(key))

    async def num_keys(self) -> int:
        return await self._count("num_keys", self.store.num_keys())

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        return await self._count("multi_get", self.store.multi_get(keys, timeout=timeout))

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        await self._count("multi_set", self.store.multi_set(keys, values))

    @property
    def counts_keys(self) -> bool:
        return self.store.counts_keys

    async def multi_set_and_count(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str
    ) -> int:
        return await self._count(
            "multi_set_and_count", self.store.multi_set_and_count(keys, values, prefix=prefix)
        )

    async def multi_set_count_and_read(
        self, keys: Sequence[str], values: Sequence[Value], *, prefix: str, read: str
    ) -> tuple[int, Snapshot]:
        return await self._count(
            "multi_set_count_and_read",
            self.store.multi_set_count_and_read(keys, values, prefix=prefix, read=read),
        )

    async def append(self, key: str, value: Value) -> None:
        await self._count("append", self.store.append(key, value))

    async def get_prefix(self, prefix: str) -> Snapshot:
        return await self._count("get_prefix", self.store.get_prefix(prefix))

    async def get_prefixes(self, prefixes: Sequence[str]) -> list[Snapshot]:
        return await self._count("get_prefixes", self.store.get_prefixes(prefixes))

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        return await self._count(
            "wait_for_change", self.store.wait_for_change(prefix, after=after, timeout=timeout)
        )

    async def ttl_remaining(self, key: str) -> float | None:
        return await self._count("ttl_remaining", self.store.ttl_remaining(key))


class TimingStore(CountingStore):
    """A :class:`CountingStore` that also records each call: ``(name, began, ended)``."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.calls: list[tuple[str, float, float]] = []

    def _count(self, name: str, call: Awaitable[T]) -> Awaitable[T]:
        async def timed() -> T:
            began = time.monotonic()
            try:
                return await call
            finally:
                self.calls.append((name, began, time.monotonic()))

        return super()._count(name, timed())


# -- one process, many handlers -----------------------------------------------------------------


async def in_process(nodes: int, transport: str) -> tuple[float, Counter[str]]:
    """Form one round of ``nodes`` handlers in this process; return seconds and store ops."""
    from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
    from aioelastic.rendezvous._parameters import ElasticSettings
    from aioelastic.store import MemoryStore, TCPStore, TCPStoreServer

    async with AsyncExitStack() as stack:
        if transport == "memory":
            base: Store = MemoryStore()
        else:
            server = await stack.enter_async_context(TCPStoreServer("127.0.0.1", 0))
            base = await stack.enter_async_context(TCPStore("127.0.0.1", server.port))
        counting = CountingStore(base)
        settings = ElasticSettings(f"bench-{uuid.uuid4().hex[:8]}", nodes, nodes)
        # Each handler lives in its own task, as in its own process: entering them all in
        # this task would nest their cancel scopes N deep (anyio walks that chain per exit).
        entered, go, formed = anyio.Event(), anyio.Event(), anyio.Event()
        counts = {"entered": 0, "formed": 0}

        async def node() -> None:
            handler = ElasticRendezvousHandler(
                counting, settings, backend="bench", local_addr="127.0.0.1"
            )
            async with handler:
                counts["entered"] += 1
                if counts["entered"] == nodes:
                    entered.set()
                await go.wait()
                await handler.next_rendezvous()
                counts["formed"] += 1
                if counts["formed"] == nodes:
                    formed.set()
                await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            for _ in range(nodes):
                tg.start_soon(node)
            await entered.wait()
            counting.counts.clear()
            started = time.perf_counter()
            go.set()
            await formed.wait()
            elapsed = time.perf_counter() - started
            operations = Counter(counting.counts)
            tg.cancel_scope.cancel()
        return elapsed, operations


# -- separate processes -------------------------------------------------------------------------


def node_main(impl: str, port: int, nodes: int, run_id: str) -> None:
    """One node: build the handler, say ready, join on 'go', report, leave on 'exit'."""
    logging.disable(logging.CRITICAL)
    if impl.startswith("torch"):
        torch_node(impl, port, nodes, run_id)
    else:
        anyio.run(ours_node, impl, port, nodes, run_id)


def _report(rank: int) -> None:
    sys.stdout.write(json.dumps({"end": time.monotonic(), "rank": rank}) + "\n")
    sys.stdout.flush()


def torch_node(impl: str, port: int, nodes: int, run_id: str) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

    rank_config: dict[str, Any] = (
        {"rank": int(os.environ["BENCH_RANK"])} if impl == "torch-static" else {}
    )
    params = RendezvousParameters(
        backend="static" if impl == "torch-static" else "c10d",
        endpoint=f"127.0.0.1:{port}",
        run_id=run_id,
        min_nodes=nodes,
        max_nodes=nodes,
        **rank_config,
    )
    handler = registry.get_rendezvous_handler(params)
    print("ready", flush=True)
    sys.stdin.readline()
    info = handler.next_rendezvous()
    _report(info.rank)
    sys.stdin.readline()
    handler.shutdown()


async def ours_node(impl: str, port: int, nodes: int, run_id: str) -> None:
    from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

    rank_config: dict[str, Any] = (
        {"rank": int(os.environ["BENCH_RANK"])} if impl == "ours-static" else {}
    )
    params = RendezvousParameters(
        "static" if impl == "ours-static" else "c10d",
        f"127.0.0.1:{port}",
        run_id,
        nodes,
        nodes,
        local_addr="127.0.0.1",
        **rank_config,
    )
    async with get_rendezvous_handler(params) as handler:
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        info = await handler.next_rendezvous()
        _report(info.rank)
        await anyio.to_thread.run_sync(sys.stdin.readline)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def processes(impl: str, nodes: int) -> float:
    """Formation time of ``nodes`` processes; node 0 starts first (it hosts the store)."""
    port, run_id = free_port(), f"bench-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "bench.rendezvous", "node", impl, str(port), str(nodes)]
    procs: list[subprocess.Popen[str]] = []
    try:
        for rank in range(nodes):
            env = {**os.environ, "BENCH_RANK": str(rank)}
            proc = subprocess.Popen(
                [*command, run_id],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            procs.append(proc)
            if rank == 0:
                _expect(proc, "ready")
        for proc in procs[1:]:
            _expect(proc, "ready")
        started = time.monotonic()
        for proc in procs:
            _send(proc, "go")
        ends = [float(json.loads(_line(proc))["end"]) for proc in procs]
        for proc in reversed(procs):  # node 0 hosts the store: it leaves last
            _send(proc, "exit")
            proc.wait(timeout=60)
        return max(ends) - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"bench node {proc.args!r} exited with {proc.wait()}")
    return line


def _expect(proc: subprocess.Popen[str], word: str) -> None:
    line = _line(proc)
    if line.strip() != word:
        raise RuntimeError(f"bench node said {line!r}, expected {word!r}")


def _send(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


# -- report -------------------------------------------------------------------------------------


def median(repeat: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeat))


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:9.1f} ms" if math.isfinite(seconds) else "        n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="N=2,16 processes; N=100 in-process")
    args = parser.parse_args()
    has_torch = importlib.util.find_spec("torch") is not None
    logging.disable(logging.CRITICAL)

    print(f"rendezvous benchmarks: median of {args.repeat} runs, {os.cpu_count()} CPUs (shared)")
    print("\nformation time, N separate processes over TCP (c10d)")
    print(f"{'N':>5} {'aioelastic':>12} {'torch':>12} {'speed-up':>9} {'target':>9}")
    sizes = (2, 16) if args.quick else (2, 4, 8, 16)
    for nodes in sizes:
        ours = median(args.repeat, functools.partial(processes, "ours", nodes))
        theirs = (
            median(args.repeat, functools.partial(processes, "torch", nodes))
            if has_torch
            else math.nan
        )
        target = f"{TARGETS[nodes] * 1000:.0f} ms" if nodes in TARGETS else ""
        print(f"{nodes:5} {fmt(ours)} {fmt(theirs)} {theirs / ours:8.1f}x {target:>9}")
    if not args.quick:
        ours = median(args.repeat, functools.partial(processes, "ours-static", 8))
        theirs = (
            median(args.repeat, functools.partial(processes, "torch-static", 8))
            if has_torch
            else math.nan
        )
        print(f"{'8 st':>5} {fmt(ours)} {fmt(theirs)} {theirs / ours:8.1f}x  (static backends)")

    print("\nformation time, N handlers in one process (torch has no in-process equivalent)")
    print(f"{'N':>5} {'memory':>12} {'tcp':>12} {'ops/node':>9} {'target':>9}")
    for nodes in (100,) if args.quick else (100, 1000):
        memory = [anyio.run(in_process, nodes, "memory") for _ in range(args.repeat)]
        tcp = [anyio.run(in_process, nodes, "tcp") for _ in range(args.repeat)]
        ops = sum(memory[0][1].values()) / nodes
        target = f"{TARGETS[nodes] * 1000:.0f} ms" if nodes in TARGETS else ""
        print(
            f"{nodes:5} {fmt(statistics.median(t for t, _ in memory))} "
            f"{fmt(statistics.median(t for t, _ in tcp))} {ops:9.2f} {target:>9}"
        )

    print("\nstore operations per round (memory store; includes each node's round monitor)")
    print(f"{'N':>5} {'total':>8} {'per node':>9}  by operation")
    for nodes in (2, 4, 8, 16, 100, 1000):
        _, counts = anyio.run(in_process, nodes, "memory")
        total = sum(counts.values())
        detail = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
        print(f"{nodes:5} {total:8} {total / nodes:9.2f}  {detail}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        node_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
