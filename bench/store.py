"""TCP store benchmarks: aioelastic's TCPStore against PyTorch's ``torch.distributed.TCPStore``.

Workloads (issue 2), each run against both stores in the same run:

* sequential: one client, one call at a time: ``set``, ``get``, ``add``, ``compare_set`` (ops/s);
* 16 processes: 16 client processes doing set+get pairs flat out (total ops/s), and the
  server's CPU time per operation meanwhile (on 2 cores, client CPU limits this workload);
* pipelined: one client, 64 concurrent ``get`` calls (torch: 64 threads sharing one client);
* fan-out: 64 waiters parked on one key, each on its own connection; time from the ``set``
  until the last of them has its value (median of rounds);
* memory: peak server RSS after writing 100,000 keys of 64 bytes (and the growth from idle);
* blocking clients: the sequential and 16-process rows again with our ``BlockingTCPStore``
  against our server, beside torch's blocking C++ client and server measured in the same
  minutes (``--rounds`` alternating rounds, medians; the main table's aioelastic column is the
  async client, which pays an event loop's turn a call);
* the cost of security: sequential and 16 processes again with TLS (certificates checked both
  ways, throwaway ones from ``trustme``), and the time to open a connection with no token, a
  token (its challenge-response is one more round trip) and TLS, against the plain server;
* torch's protocol (``--torch-protocol``): torch's own client against our server and against
  torch's C++ server: sequential ``set``/``get``/``add``/``wait``, 16 processes doing set+get,
  and ``init_process_group`` of 16 gloo ranks (``TORCHELASTIC_USE_AGENT_STORE=True``, so every
  rank is a client of the server, as under an agent).

Each server runs in its own process (``python -m bench.store host ours|torch``); clients run in
the bench process (ours on uvloop when installed) or in worker processes. ``--placement`` pins
the sequential rows' client and server to one CPU (``same``) or to two (``apart``): on this VM a
round trip costs several times more when the two wake each other across CPUs, and which the
scheduler picks (``free``, the default) decides a sequential row more than the code does. Ratios are
aioelastic / torch, so above 1 is better for throughput rows and below 1 is better for latency
and memory rows. The machine is shared: figures are noisy. torch rows are skipped without torch.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

HAVE_TORCH = importlib.util.find_spec("torch") is not None
VALUE = b"v" * 64
SEQUENTIAL_OPS = 5000
PROCESSES, PAIRS = 16, 1000
PIPELINED_OPS, CONCURRENCY = 20000, 64
WAITERS, FANOUT_ROUNDS = 64, 7
MEMORY_KEYS = 100_000
PLACEMENT = "free"
"""Where the sequential rows run: ``free`` (the scheduler's choice), ``same`` CPU, ``apart``."""
ROUNDS = 3
"""Alternating rounds of the blocking clients' sequential rows."""


# -- server hosts (run in their own process) ------------------------------------------------


def host(kind: str) -> None:
    """Serve on a free loopback port; print it; serve until stdin closes."""
    if kind == "torch":
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        print(store.port, flush=True)
        sys.stdin.read()
        return

    import anyio

    async def serve() -> None:
        async with _credentials(kind).server("127.0.0.1") as server:
            print(server.port, flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)

    anyio.run(serve, backend_options=_loop_options())


SECURED = ("ours-token", "ours-tls")
"""Store kinds that are ours with a token, or with TLS (files in ``$BENCH_STORE_TLS_DIR``)."""
TOKEN = b"bench-token-" + b"0" * 52


@functools.cache
def _credentials(kind: str) -> Any:
    from aioelastic.store._credentials import StoreCredentials

    if kind == "ours-token":
        return StoreCredentials(TOKEN)
    if kind == "ours-tls":
        tls = os.environ["BENCH_STORE_TLS_DIR"]
        return StoreCredentials.from_files(
            cacert=f"{tls}/ca.pem", cert=f"{tls}/node.pem", key=f"{tls}/node.key"
        )
    return StoreCredentials()


def ours_client(kind: str, port: int) -> Any:
    """An (unopened) TCPStore with the credentials ``kind`` needs."""
    return _credentials(kind).client("127.0.0.1", port)


@contextmanager
def throwaway_certificates() -> Iterator[bool]:
    """Point ``$BENCH_STORE_TLS_DIR`` at a fresh CA and loopback certificate; False without
    trustme (the TLS rows are then skipped)."""
    import tempfile

    if importlib.util.find_spec("trustme") is None:
        yield False
        return
    import trustme

    with tempfile.TemporaryDirectory() as tls:
        ca = trustme.CA()
        ca.cert_pem.write_to_path(f"{tls}/ca.pem")
        issued = ca.issue_cert("127.0.0.1")
        issued.cert_chain_pems[0].write_to_path(f"{tls}/node.pem")
        issued.private_key_pem.write_to_path(f"{tls}/node.key")
        os.environ["BENCH_STORE_TLS_DIR"] = tls
        try:
            yield True
        finally:
            del os.environ["BENCH_STORE_TLS_DIR"]


def _loop_options() -> dict[str, bool]:
    return {"use_uvloop": importlib.util.find_spec("uvloop") is not None}


@contextmanager
def server(kind: str) -> Iterator[tuple[int, int]]:
    """Start a server host; yield (port, pid)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.store", "host", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield port, process.pid
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time used so far by ``pid``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def placed(server_pid: int) -> Iterator[None]:
    """Pin this process and every thread of the server as ``PLACEMENT`` says, until the end
    (torch's server answers from a thread of its own, so each thread is pinned)."""
    if PLACEMENT == "free":
        yield
        return
    mine = os.sched_getaffinity(0)
    first, second = sorted(mine)[:2] if len(mine) > 1 else (min(mine), min(mine))
    server_cpu = first if PLACEMENT == "same" else second
    os.sched_setaffinity(0, {first})
    for thread in os.listdir(f"/proc/{server_pid}/task"):
        os.sched_setaffinity(int(thread), {server_cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
        for thread in os.listdir(f"/proc/{server_pid}/task"):
            os.sched_setaffinity(int(thread), mine)


def rss_kib(pid: int) -> tuple[int, int]:
    """Return (current, peak) resident memory of ``pid`` in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value.split()[0] if value.split() else "0"
    return int(fields["VmRSS"]), int(fields["VmHWM"])


# -- torch clients --------------------------------------------------------------------------


def torch_client(port: int) -> Any:
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


@dataclass
class Rate:
    """One sequential workload: calls per second, and CPU per call of client and server."""

    per_second: float
    client_us: float
    server_us: float


def meter(server_pid: int) -> Callable[[int], Rate]:
    """Start measuring; the function returned ends it and gives the rate of ``calls`` calls."""
    server_cpu, cpu, start = cpu_seconds(server_pid), time.process_time(), time.perf_counter()

    def stop(calls: int) -> Rate:
        elapsed = time.perf_counter() - start
        client_us = (time.process_time() - cpu) / calls * 1e6
        server_us = (cpu_seconds(server_pid) - server_cpu) / calls * 1e6
        return Rate(calls / elapsed, client_us, server_us)

    return stop


def timed(calls: int, run: Callable[[], object], server_pid: int) -> Rate:
    stop = meter(server_pid)
    run()
    return stop(calls)


def blocking_client(port: int) -> Any:
    """Our blocking client (:class:`~aioelastic.store.BlockingTCPStore`), connected."""
    from aioelastic.store import BlockingTCPStore

    return BlockingTCPStore("127.0.0.1", port, timeout=60)


def torch_sequential(
    port: int,
    server_pid: int,
    ops: tuple[str, ...] = ("set", "get", "add", "compare_set"),
    connect: Callable[[int], Any] = torch_client,
) -> dict[str, Rate]:
    """A blocking client (torch's, or ``connect``'s), one call at a time, for each of ``ops``
    in order (``set`` writes the keys that ``get`` and ``wait`` read)."""
    s = connect(port)
    for i in range(100):
        s.set(f"warm{i}", VALUE)
    n = SEQUENTIAL_OPS
    calls: dict[str, Callable[[], object]] = {
        "set": lambda: [s.set(f"k{i}", VALUE) for i in range(n)],
        "get": lambda: [s.get(f"k{i}") for i in range(n)],
        "add": lambda: [s.add("counter", 1) for _ in range(n)],
        "compare_set": lambda: [s.compare_set("k0", VALUE, VALUE) for _ in range(n)],
        "wait": lambda: [s.wait([f"k{i}"]) for i in range(n)],
    }
    return {op: timed(n, calls[op], server_pid) for op in ops}


def torch_pipelined(port: int) -> float:
    store = torch_client(port)
    store.set("p", VALUE)
    per_thread = PIPELINED_OPS // CONCURRENCY

    def work() -> None:
        for _ in range(per_thread):
            store.get("p")

    threads = [threading.Thread(target=work) for _ in range(CONCURRENCY)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return per_thread * CONCURRENCY / (time.perf_counter() - start)


def torch_fanout(port: int) -> float:
    setter = torch_client(port)
    clients = [torch_client(port) for _ in range(WAITERS)]
    latencies = []
    for round_ in range(FANOUT_ROUNDS):
        key = f"go{round_}"
        woke: list[float] = []
        lock = threading.Lock()

        def wait(client: Any, key: str = key, woke: list[float] = woke, lock: Any = lock) -> None:
            client.get(key)
            with lock:
                woke.append(time.perf_counter())

        threads = [threading.Thread(target=wait, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # let every waiter park (a bench may sleep; tests may not)
        start = time.perf_counter()
        setter.set(key, b"1")
        for thread in threads:
            thread.join()
        latencies.append(max(woke) - start)
    return statistics.median(latencies)


def torch_fill(port: int) -> None:
    store = torch_client(port)
    for i in range(MEMORY_KEYS):
        store.set(f"key{i:06d}", VALUE)
    store.get(f"key{MEMORY_KEYS - 1:06d}")


# -- aioelastic clients ---------------------------------------------------------------------


def run_async(fn: Callable[..., object], *args: object) -> object:
    import anyio

    return anyio.run(fn, *args, backend_options=_loop_options())  # type: ignore[arg-type]


async def ours_sequential(port: int, server_pid: int, kind: str = "ours") -> dict[str, Rate]:
    async with ours_client(kind, port) as s:
        for i in range(100):
            await s.set(f"warm{i}", VALUE)
        n = SEQUENTIAL_OPS

        async def set_() -> None:
            for i in range(n):
                await s.set(f"k{i}", VALUE)

        async def get() -> None:
            for i in range(n):
                await s.get(f"k{i}")

        async def add() -> None:
            for _ in range(n):
                await s.add("counter", 1)

        async def compare_set() -> None:
            for _ in range(n):
                await s.compare_set("k0", VALUE, VALUE)

        rates = {}
        for op, run in (("set", set_), ("get", get), ("add", add), ("compare_set", compare_set)):
            stop = meter(server_pid)
            await run()
            rates[op] = stop(n)
        return rates


async def ours_pipelined(port: int) -> float:
    import anyio

    from aioelastic.store import TCPStore

    async with TCPStore("127.0.0.1", port) as store:
        await store.set("p", VALUE)
        per_task = PIPELINED_OPS // CONCURRENCY

        async def work() -> None:
            for _ in range(per_task):
                await store.get("p")

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CONCURRENCY):
                tg.start_soon(work)
        return per_task * CONCURRENCY / (time.perf_counter() - start)


async def ours_fanout(port: int) -> float:
    import contextlib

    import anyio

    from aioelastic.store import TCPStore

    async with contextlib.AsyncExitStack() as stack:
        setter = await stack.enter_async_context(TCPStore("127.0.0.1", port))
        clients = [
            await stack.enter_async_context(TCPStore("127.0.0.1", port)) for _ in range(WAITERS)
        ]
        latencies = []
        for round_ in range(FANOUT_ROUNDS):
            key = f"go{round_}"
            woke: list[float] = []

            async def wait(client: TCPStore, key: str = key, woke: list[float] = woke) -> None:
                await client.get(key)
                woke.append(time.perf_counter())

            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(wait, client)
                await anyio.sleep(0.3)  # let every waiter park
                start = time.perf_counter()
                await setter.set(key, b"1")
            latencies.append(max(woke) - start)
        return statistics.median(latencies)


async def ours_fill(port: int) -> None:
    import anyio

    from aioelastic.store import TCPStore

    async with TCPStore("127.0.0.1", port) as store:

        async def fill(offset: int) -> None:
            for i in range(offset, MEMORY_KEYS, 16):
                await store.set(f"key{i:06d}", VALUE)

        async with anyio.create_task_group() as tg:
            for offset in range(16):
                tg.start_soon(fill, offset)
        await store.get(f"key{MEMORY_KEYS - 1:06d}")


# -- 16 worker processes -----------------------------------------------------------------


def worker(kind: str, port: int, pairs: int) -> None:
    """Connect, say ready, wait for 'go' on stdin, do ``pairs`` set+get pairs, say done."""
    me = os.getpid()
    if kind in ("torch", "ours-blocking"):
        store = torch_client(port) if kind == "torch" else blocking_client(port)
        print("ready", flush=True)
        sys.stdin.readline()
        cpu = time.process_time()
        for i in range(pairs):
            store.set(f"w{me}-{i}", VALUE)
            store.get(f"w{me}-{i}")
        print("done", time.process_time() - cpu, flush=True)
        return

    async def run() -> None:
        import anyio

        async with ours_client(kind, port) as store:
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            cpu = time.process_time()
            for i in range(pairs):
                await store.set(f"w{me}-{i}", VALUE)
                await store.get(f"w{me}-{i}")
            print("done", time.process_time() - cpu, flush=True)

    run_async(run)


def go_together(commands: list[list[str]]) -> tuple[float, float]:
    """Start the ``bench.store`` processes, wait until each says ready, tell them all to go;
    return the seconds until the last says done, and the CPU seconds they report with it."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.store", *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
    start = time.perf_counter()
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    reported = 0.0
    for process in processes:
        assert process.stdout is not None
        done, *cpu = process.stdout.readline().split()
        assert done == "done"
        reported += float(cpu[0]) if cpu else 0.0
    elapsed = time.perf_counter() - start
    for process in processes:
        process.wait(timeout=120)  # torch's processes take long to exit on a loaded machine
    return elapsed, reported


def many_processes(kind: str, port: int, server_pid: int) -> dict[str, float]:
    """16 processes doing set+get pairs: total calls/s, and CPU per call of clients and server."""
    commands = [["worker", kind, str(port), str(PAIRS)] for _ in range(PROCESSES)]
    ops = PROCESSES * PAIRS * 2
    server_cpu = cpu_seconds(server_pid)
    elapsed, client_cpu = go_together(commands)
    return {
        "16 processes set+get": ops / elapsed,
        "  server CPU per op, 16 processes": (cpu_seconds(server_pid) - server_cpu) / ops * 1e6,
        "  client CPU per op, 16 processes": client_cpu / ops * 1e6,
    }


GLOO_RANKS = 16


def process_group_rank(port: int, rank: int, world: int) -> None:
    """Import torch, say ready, wait for 'go', join a gloo group through the store at ``port``
    (and pass one barrier)."""
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # every rank a client, as under an agent
    import torch.distributed as dist

    print("ready", flush=True)
    sys.stdin.readline()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    dist.barrier()  # every pair connected before anyone tears the group down
    dist.destroy_process_group()
    print("done", flush=True)


def init_process_group_seconds(port: int) -> float:
    """Seconds from 'go' until all :data:`GLOO_RANKS` ranks formed their gloo group."""
    elapsed, _ = go_together(
        [["pg", str(port), str(rank), str(GLOO_RANKS)] for rank in range(GLOO_RANKS)]
    )
    return elapsed


def measure_torch_protocol(kind: str) -> dict[str, float]:
    """torch's client against one server kind (``ours`` or ``torch``); figures by row name."""
    figures: dict[str, float] = {}
    with server(kind) as (port, pid), placed(pid):  # (--placement applies here too)
        for op, rate in torch_sequential(port, pid, ("set", "get", "add", "wait")).items():
            figures[f"torch client: sequential {op}"] = rate.per_second
            figures[f"  server CPU per {op}"] = rate.server_us
    with server(kind) as (port, pid):
        for name, value in many_processes("torch", port, pid).items():
            figures[name.replace("16 processes set", "torch client: 16 processes set")] = value
    with server(kind) as (port, pid):
        cpu = cpu_seconds(pid)
        seconds = init_process_group_seconds(port)
        figures[f"init_process_group, {GLOO_RANKS} gloo"] = seconds * 1000
        figures[f"  server CPU, {GLOO_RANKS}-rank init"] = (cpu_seconds(pid) - cpu) * 1000
    return figures


TORCH_PROTOCOL_UNITS = {
    "torch client": "ops/s",
    "  client CPU per op": "us",
    "init_process_group": "ms",
    "  server CPU per": "us",
    "  server CPU,": "ms",
}


def print_torch_protocol() -> None:
    if not HAVE_TORCH:
        print("torch-protocol rows skipped: torch is not installed")
        return
    ours, theirs = measure_torch_protocol("ours"), measure_torch_protocol("torch")
    print("torch's TCPStore client: against our server vs against torch's C++ server")
    print(f"{'workload':<34} {'unit':<7} {'aioelastic':>12} {'torch':>12} {'ratio':>7}")
    for name, value in ours.items():
        unit = next(u for prefix, u in TORCH_PROTOCOL_UNITS.items() if name.startswith(prefix))
        print(Row(name, unit, value, theirs.get(name)).render())


# -- the table --------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    unit: str
    ours: float
    torch: float | None

    def render(self) -> str:
        theirs = "-" if self.torch is None else f"{self.torch:,.1f}"
        ratio = "-" if not self.torch else f"{self.ours / self.torch:.2f}"
        return f"{self.name:<34} {self.unit:<7} {self.ours:>12,.1f} {theirs:>12} {ratio:>7}"


def measure(kind: str, rows: tuple[str, ...] = ()) -> dict[str, float]:
    """Run every workload (or those whose names start with one of ``rows``) against one store
    kind; return figures by row name."""
    figures: dict[str, float] = {}
    with server(kind) as (port, pid), placed(pid):
        sequential = (
            torch_sequential(port, pid)
            if kind == "torch"
            else run_async(ours_sequential, port, pid, kind)
        )
        assert isinstance(sequential, dict)
        for op, rate in sequential.items():
            figures[f"sequential {op}"] = rate.per_second
        for op, rate in sequential.items():
            figures[f"  client CPU per {op}"] = rate.client_us
            figures[f"  server CPU per {op}"] = rate.server_us
    with server(kind) as (port, pid):
        figures.update(many_processes(kind, port, pid))
    if rows:
        return figures
    with server(kind) as (port, _):
        pipelined = torch_pipelined(port) if kind == "torch" else run_async(ours_pipelined, port)
        assert isinstance(pipelined, float)
        figures[f"{CONCURRENCY} concurrent get, 1 client"] = pipelined
    with server(kind) as (port, _):
        fanout = torch_fanout(port) if kind == "torch" else run_async(ours_fanout, port)
        assert isinstance(fanout, float)
        figures[f"{WAITERS} waiters woken by one set"] = fanout * 1000
    with server(kind) as (port, pid):
        idle, _ = rss_kib(pid)
        torch_fill(port) if kind == "torch" else run_async(ours_fill, port)
        _, peak = rss_kib(pid)
        figures["server peak RSS, 100k keys"] = peak / 1024
        figures["server RSS growth, 100k keys"] = (peak - idle) / 1024
    return figures


CONNECTS = 200


async def ours_connect(port: int, kind: str) -> float:
    """Median time to open a connection (TCP, TLS if any, handshake), in ms."""
    times = []
    for _ in range(CONNECTS):
        start = time.perf_counter()
        async with ours_client(kind, port):
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure_security() -> list[tuple[str, str, float, float]]:
    """Rows (name, unit, plain, secured) for what a token and TLS cost."""
    rows = []
    with server("ours") as (port, _):
        plain_connect = run_async(ours_connect, port, "ours")
    for kind in SECURED:
        with server(kind) as (port, _):
            secured = run_async(ours_connect, port, kind)
        assert isinstance(plain_connect, float)
        assert isinstance(secured, float)
        rows.append((f"open a connection, {kind[5:]}", "ms", plain_connect, secured))
    plain = measure("ours", rows=("sequential", "16 processes"))
    tls = measure("ours-tls", rows=("sequential", "16 processes"))
    for name, value in tls.items():
        unit = next(u for prefix, u in UNITS.items() if name.startswith(prefix))
        rows.append((f"{name}, tls", unit, plain[name], value))
    return rows


UNITS = {
    "sequential": "ops/s",
    "16 processes": "ops/s",
    f"{CONCURRENCY} concurrent": "ops/s",
    f"{WAITERS} waiters": "ms",
    "server": "MiB",
    "  server CPU": "us",
    "  client CPU": "us",
}


def main() -> None:
    global PLACEMENT, ROUNDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-torch", action="store_true", help="measure aioelastic only")
    parser.add_argument(
        "--security", action="store_true", help="measure only what a token and TLS cost"
    )
    parser.add_argument(
        "--hot-path",
        action="store_true",
        help="measure only the sequential and 16-process rows (with CPU per call), both stores",
    )
    parser.add_argument(
        "--torch-protocol",
        action="store_true",
        help="measure only torch's client against our server and against torch's",
    )
    parser.add_argument(
        "--placement",
        choices=("free", "same", "apart"),
        default=PLACEMENT,
        help="where the sequential rows' client and server run: the scheduler's choice, pinned "
        "to one CPU, or pinned to two (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help="alternating rounds of the blocking clients' sequential rows (default: %(default)s)",
    )
    args = parser.parse_args()
    PLACEMENT, ROUNDS = args.placement, args.rounds
    if args.security:
        print_security()
        return
    if args.torch_protocol:
        print_torch_protocol()
        return
    rows = ("sequential", "16 processes") if args.hot_path else ()
    ours = measure("ours", rows)
    theirs = measure("torch", rows) if HAVE_TORCH and not args.no_torch else {}
    loop = "uvloop" if _loop_options()["use_uvloop"] else "asyncio"
    print(f"TCP store, aioelastic (client and server on {loop}) vs torch.distributed.TCPStore")
    print(f"{'workload':<34} {'unit':<7} {'aioelastic':>12} {'torch':>12} {'ratio':>7}")
    for name, value in ours.items():
        unit = next(u for prefix, u in UNITS.items() if name.startswith(prefix))
        print(Row(name, unit, value, theirs.get(name)).render())
    if HAVE_TORCH and not args.no_torch:
        print()
        print_blocking()
    if args.hot_path:
        return
    print()
    print_security()
    if not args.no_torch:
        print()
        print_torch_protocol()


BLOCKING_OPS = ("set", "get", "add", "compare_set")


def measure_blocking() -> tuple[dict[str, float], dict[str, float]]:
    """The hot-path rows with our blocking client (BlockingTCPStore) against our server, and
    with torch's client against torch's server in the same minutes: ``ROUNDS`` alternating
    rounds of the sequential rows (medians), then each 16-process row. Returns (ours, torch)."""
    runs: dict[str, dict[str, list[Rate]]] = {"ours": {}, "torch": {}}
    with server("ours") as (ours_port, ours_pid), server("torch") as (torch_port, torch_pid):
        for _ in range(ROUNDS):
            with placed(ours_pid):
                ours = torch_sequential(ours_port, ours_pid, BLOCKING_OPS, blocking_client)
            with placed(torch_pid):
                theirs = torch_sequential(torch_port, torch_pid, BLOCKING_OPS)
            for kind, rates in (("ours", ours), ("torch", theirs)):
                for op, rate in rates.items():
                    runs[kind].setdefault(op, []).append(rate)
    figures: dict[str, dict[str, float]] = {"ours": {}, "torch": {}}
    for kind, by_op in runs.items():
        for op, rates in by_op.items():
            figures[kind][f"sequential {op}"] = statistics.median(r.per_second for r in rates)
            figures[kind][f"  client CPU per {op}"] = statistics.median(r.client_us for r in rates)
            figures[kind][f"  server CPU per {op}"] = statistics.median(r.server_us for r in rates)
    for kind, worker_kind in (("ours", "ours-blocking"), ("torch", "torch")):
        with server(kind) as (port, pid):
            figures[kind].update(many_processes(worker_kind, port, pid))
    return figures["ours"], figures["torch"]


def print_blocking() -> None:
    """Like with like: blocking clients on both sides (torch's C++ client is blocking), both
    measured in the same minutes."""
    ours, theirs = measure_blocking()
    print(
        "Blocking clients: aioelastic's BlockingTCPStore and server vs torch's client and server "
        f"(sequential rows: median of {ROUNDS} alternating rounds)"
    )
    print(f"{'workload':<34} {'unit':<7} {'aioelastic':>12} {'torch':>12} {'ratio':>7}")
    for name, value in ours.items():
        unit = next(u for prefix, u in UNITS.items() if name.startswith(prefix))
        print(Row(name, unit, value, theirs.get(name)).render())


def print_security() -> None:
    with throwaway_certificates() as have_trustme:
        if not have_trustme:
            print("security rows skipped: install trustme to make throwaway certificates")
            return
        rows = measure_security()
    print("The cost of security: aioelastic plain vs with a token or TLS (ratio secured/plain)")
    print(f"{'workload':<34} {'unit':<7} {'plain':>12} {'secured':>12} {'ratio':>7}")
    for name, unit, plain, secured in rows:
        print(f"{name:<34} {unit:<7} {plain:>12,.2f} {secured:>12,.2f} {secured / plain:>7.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "host":
        host(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "pg":
        process_group_rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
