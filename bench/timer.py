"""Watchdog-timer benchmarks: aioelastic's FileTimerServer against PyTorch's, same run.

* expiry latency: from a timer's deadline (wall clock) to its worker observed dead, with 1,
  100 and 10,000 active timers (p50 / p99 over ``--samples`` workers, one at a time);
* throughput: requests/s from 1 and 8 client processes writing flat out (open, write, close
  per request, as torch's client does), until the server has read them all; with torch's
  client against both servers, then end to end (each side's own client); with the server's
  CPU time per request (polled for progress only after the clients finished);
* pipe full: how many BlockingIOError an unmodified torch client meets writing flat out
  (it would crash a real worker; the bench retries and counts);
* idle CPU: server CPU time per second while 1,000 timers sit armed;
* stacks before the kill: deadline to death of an 8-thread Python worker with the agent's
  stack capture before the reap (py-spy, or the worker's faulthandler signal) and without;
  and the server's CPU per request with the capture hook set (it runs only on expiry).

Each server runs in its own host process (``python -m bench.timer host ours|torch PATH``).
torch's server reaps by signalling the worker *and then its own process*, so workers are armed
with SIGTERM and the torch host ignores SIGTERM; torch runs with ``max_interval=0.1`` (what
torch's agent uses). Run ``python -m bench.timer``; torch rows are skipped without torch.
The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TORCH_INTERVAL = 0.1
# Seconds between arming a worker's timer and its deadline: random, so deadlines fall at any
# phase of torch's polling loop rather than always just after a request woke it.
ARM_AHEAD = (0.05, 0.35)


def line(pid: int, scope: str, expiration: float, signum: int) -> bytes:
    """A version-1 request, the bytes both servers read."""
    body = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": expiration}
    return json.dumps({**body, "signal": signum}).encode() + b"\n"


# -- server hosts ---------------------------------------------------------------------------


STACKS_DIR = "AIOELASTIC_STACK_DIR"


def host_ours(path: str, capture_with: str | None = None, coalesce: float | None = None) -> None:
    """Our server; with ``capture_with`` (py-spy, faulthandler) the agent's stack capture runs
    before each reap, as ``aioelastic run`` does (workers' faulthandler files in $STACKS_DIR);
    ``coalesce`` replaces the server's default gathering window (kind ``ours@SECONDS``)."""
    import anyio

    from aioelastic.agent._forensics import STACK_SIGNAL, capture, find_py_spy
    from aioelastic.timer import FileTimerServer, TimerExpired

    logging.disable(logging.CRITICAL)  # as for torch's host: measure serving, not logging

    async def before_reap(expired: TimerExpired) -> None:
        got = await capture(
            expired.pid,
            py_spy=find_py_spy("auto") if capture_with == "py-spy" else None,
            signal_dir=os.environ[STACKS_DIR] if capture_with == "faulthandler" else None,
            signum=STACK_SIGNAL,
            timeout=5.0,
        )
        if got.method != capture_with:
            raise RuntimeError(f"{capture_with} captured nothing: {got.reason}")

    async def serve() -> None:
        hook = before_reap if capture_with else None
        options = {} if coalesce is None else {"coalesce": coalesce}
        async with FileTimerServer(path, "bench", before_reap=hook, **options) as server:
            os.write(1, b"ready\n")
            buffer = b""
            while True:
                await anyio.wait_readable(0)
                data = os.read(0, 4096)
                if not data:
                    return
                buffer += data
                while b"\n" in buffer:
                    command, buffer = buffer.split(b"\n", 1)
                    os.write(1, answer(command, server.statistics().requests))

    anyio.run(serve)


def host_torch(path: str) -> None:
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerServer

    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torch signals its own process after a reap
    server = FileTimerServer(path, "bench", max_interval=TORCH_INTERVAL)
    server.start()
    os.write(1, b"ready\n")
    for command in sys.stdin.buffer:
        os.write(1, answer(command.strip(), server._request_count))


def answer(command: bytes, requests: int) -> bytes:
    if command == b"cpu":
        return f"{time.process_time()}\n".encode()
    return f"{requests}\n".encode()


class Host:
    """A server host process and the line protocol to ask it for counters."""

    def __init__(self, kind: str, path: str) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", "bench.timer", "host", kind, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.ask_raw() == "ready"

    def ask_raw(self, command: str | None = None) -> str:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().decode().strip()

    def requests(self) -> int:
        return int(self.ask_raw("count"))

    def cpu(self) -> float:
        return float(self.ask_raw("cpu"))

    def wait_requests(self, count: int) -> float:
        """Poll until the server has read ``count`` requests; return when (wall clock)."""
        while self.requests() < count:
            time.sleep(0.002)
        return time.time()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@contextmanager
def hosted(kind: str) -> Iterator[Host]:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[STACKS_DIR] = tmp  # the host and the workers started from here share it
        host = Host(kind, str(Path(tmp) / "timer.fifo"))
        try:
            yield host
        finally:
            host.close()


def send(path: str, data: bytes) -> None:
    """Write ``data`` through a blocking descriptor (bulk loading; may wait for the reader)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:4096]) :]
    finally:
        os.close(fd)


# -- measurements ---------------------------------------------------------------------------


def expiry_latencies(host: Host, active: int, samples: int) -> list[float]:
    """Seconds from deadline to death of ``samples`` workers, with ``active`` timers armed."""
    anchor = subprocess.Popen(["sleep", "3600"])
    try:
        later = time.time() + 3600
        loaded = host.requests() + active - 1
        send(host.path, b"".join(line(anchor.pid, f"bg{i}", later, 0) for i in range(active - 1)))
        host.wait_requests(loaded)
        return [time_to_death(host, subprocess.Popen(["sleep", "3600"])) for _ in range(samples)]
    finally:
        anchor.kill()
        anchor.wait()


THREADED_WORKER = """\
import os, signal, sys, threading, time
from aioelastic.timer._stackdump import register_stack_dump
for _ in range(7):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
register_stack_dump({"AIOELASTIC_STACK_SIGNAL": sys.argv[1], "AIOELASTIC_STACK_DIR": sys.argv[2]})
print("ready", flush=True)
time.sleep(3600)
"""


def reap_latencies(host: Host, samples: int) -> list[float]:
    """Seconds from deadline to death of ``samples`` Python workers of 8 threads each."""
    from aioelastic.agent._forensics import STACK_SIGNAL

    argv = [sys.executable, "-c", THREADED_WORKER, str(int(STACK_SIGNAL)), os.environ[STACKS_DIR]]
    latencies = []
    for _ in range(samples):
        worker = subprocess.Popen(argv, stdout=subprocess.PIPE)
        assert worker.stdout is not None
        assert worker.stdout.readline() == b"ready\n"
        latencies.append(time_to_death(host, worker))
    return latencies


def time_to_death(host: Host, worker: subprocess.Popen[bytes]) -> float:
    """Arm ``worker``'s timer a moment ahead; seconds from its deadline to its death."""
    pidfd = os.pidfd_open(worker.pid)
    try:
        deadline = time.time() + random.uniform(*ARM_AHEAD)
        send(host.path, line(worker.pid, "step", deadline, signal.SIGTERM))
        select.select([pidfd], [], [], 60)
        return time.time() - deadline
    finally:
        os.close(pidfd)
        worker.kill()
        worker.wait()


CLIENT = {
    "ours": "from aioelastic.timer import FileTimerClient as Client",
    "torch": "from torch.distributed.elastic.timer import FileTimerClient as Client",
}


def client_main(kind: str, path: str, count: int) -> None:
    """Send ``count`` requests flat out; print start time and BlockingIOErrors met."""
    namespace: dict[str, type] = {}
    exec(CLIENT[kind], namespace)
    client = namespace["Client"](path, signal.SIGTERM)
    acquire = getattr(client, "acquire_sync", client.acquire)
    release = getattr(client, "release_sync", client.release)
    expiration = time.time() + 3600
    full = 0
    print("ready", flush=True)
    sys.stdin.readline()  # wait for "go" so imports are not timed
    start = time.time()
    for i in range(count):
        while True:
            try:
                if i % 2:
                    release(f"s{i // 2 % 10}")
                else:
                    acquire(f"s{i // 2 % 10}", expiration)
                break
            except BlockingIOError:
                full += 1
                time.sleep(0.001)
    print(start, full, flush=True)


def throughput(
    host: Host, client: str, processes: int, per_client: int
) -> tuple[float, int, float]:
    """Requests/s read by the server, BlockingIOErrors the clients met, server CPU µs/request.

    The rate is bound by CPU shared with the clients (and whoever else uses the machine), so
    it is noisy; the server's CPU time per request is the steadier figure. The bench asks the
    server for its count only once the clients are done: a poll every 2 ms while they wrote
    cost our asyncio host (a loop wake-up per poll) several µs per request, torch's host
    (a blocking read in its main thread) less, and neither is serving.
    """
    before, cpu = host.requests(), host.cpu()
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                "-W",
                "ignore",
                "-m",
                "bench.timer",
                "client",
                client,
                host.path,
                str(per_client),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for proc in clients:  # a barrier: every client has imported before any starts
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
    for proc in clients:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    starts, fulls = [], 0
    for proc in clients:  # before polling: the polls would cost the server CPU while it serves
        out, _ = proc.communicate()
        start, full = out.split()
        starts.append(float(start))
        fulls += int(full)
    done = host.wait_requests(before + processes * per_client)
    total = processes * per_client
    return total / (done - min(starts)), fulls, (host.cpu() - cpu) / total * 1e6


def idle_cpu(host: Host, timers: int, seconds: float) -> float:
    """Server CPU seconds per wall second with ``timers`` armed and no traffic."""
    anchor = subprocess.Popen(["sleep", "3600"])
    try:
        later = time.time() + 3600
        loaded = host.requests() + timers
        send(host.path, b"".join(line(anchor.pid, f"idle{i}", later, 0) for i in range(timers)))
        host.wait_requests(loaded)
        time.sleep(1.0)  # let the server settle after loading
        before = host.cpu()
        time.sleep(seconds)
        return (host.cpu() - before) / seconds
    finally:
        anchor.kill()
        anchor.wait()


# -- report ---------------------------------------------------------------------------------


def row(name: str, ours: float, torch: float | None, unit: str, lower_is_better: bool) -> str:
    if torch is None:
        return f"{name:<38} {ours:>12.4g} {'-':>12} {'-':>8}  {unit}"
    ratio = (torch / ours if lower_is_better else ours / torch) if ours else float("inf")
    return f"{name:<38} {ours:>12.4g} {torch:>12.4g} {ratio:>7.1f}x  {unit}"


def one_client(kinds: list[str], args: argparse.Namespace) -> None:
    """Server CPU per request and rate of one client writing flat out, each host kind taking
    its turn ``--repeat`` times (medians), so all see the same minutes of the machine's load."""
    writer = "torch" if "torch" in kinds else "ours"
    turns: dict[str, list[tuple[float, int, float]]] = {kind: [] for kind in kinds}
    for _ in range(args.repeat):
        for kind in kinds:
            with hosted(kind) as host:
                turns[kind].append(throughput(host, writer, 1, args.requests))
    print(f"one {writer} client, {args.requests} requests, median of {args.repeat} turns")
    print(f"{'server':<14} {'CPU/request us':>15} {'req/s':>10} {'pipe full':>10}  (all turns)")
    for kind, column in turns.items():
        rate, full, cost = (statistics.median(values) for values in zip(*column, strict=True))
        every = " ".join(f"{turn[2]:.1f}" for turn in column)
        print(f"{kind:<14} {cost:>15.2f} {rate:>10.0f} {full:>10.0f}  ({every})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30, help="workers reaped per latency row")
    parser.add_argument("--requests", type=int, default=4000, help="requests per client")
    parser.add_argument("--repeat", type=int, default=3, help="turns per throughput figure")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU sampling")
    parser.add_argument(
        "--one-client",
        nargs="*",
        type=float,
        metavar="COALESCE",
        help="measure only the server CPU per request of one client, our server with its "
        "default window and with each COALESCE window (s), turn by turn with torch's",
    )
    args = parser.parse_args()
    kinds = ["ours"] + (["torch"] if importlib.util.find_spec("torch") else [])
    if args.one_client is not None:
        one_client(kinds + [f"ours@{seconds:g}" for seconds in args.one_client], args)
        return
    results: dict[str, dict[str, float]] = {kind: {} for kind in kinds}
    writer = "torch" if "torch" in kinds else "ours"
    for kind in kinds:
        r = results[kind]
        for active in (1, 100, 10_000):
            with hosted(kind) as host:
                lat = sorted(expiry_latencies(host, active, args.samples))
            r[f"expiry p50, {active} timers"] = statistics.median(lat) * 1000
            r[f"expiry p99, {active} timers"] = lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1000
        with hosted(kind) as host:
            r["idle CPU, 1000 timers"] = idle_cpu(host, 1000, args.idle) * 100
    # Stacks before the kill: deadline to death of an 8-thread Python worker, with the agent's
    # capture before the reap (py-spy, or the worker's faulthandler signal) and without.
    for capture_with in ("none", "py-spy", "faulthandler"):
        with hosted("ours" if capture_with == "none" else f"ours-{capture_with}") as host:
            lat = sorted(reap_latencies(host, max(3, args.samples // 3)))
        results["ours"][f"reap p50, 8 threads, capture {capture_with}"] = (
            statistics.median(lat) * 1000
        )
    # Throughput shares the CPU with the clients and with whoever else uses the machine, so the
    # servers take turns, --repeat times, and each figure is the median of its turns.
    for processes in (1, 8):
        turns: dict[str, list[tuple[float, int, float]]] = {kind: [] for kind in kinds}
        own: list[float] = []
        for _ in range(args.repeat):
            for kind in kinds:
                with hosted(kind) as host:
                    turns[kind].append(throughput(host, writer, processes, args.requests))
            with hosted("ours") as host:  # end to end: our client and our server
                own.append(throughput(host, "ours", processes, args.requests)[0])
        for kind in kinds:
            rate, full, cost = (
                statistics.median(column) for column in zip(*turns[kind], strict=True)
            )
            r = results[kind]
            r[f"throughput, {processes} {writer} client(s)"] = rate
            r[f"pipe full, {processes} {writer} client(s)"] = full
            r[f"server CPU/request, {processes} {writer} client(s)"] = cost
        results["ours"][f"throughput, {processes} own client(s)"] = statistics.median(own)
        if processes == 1:  # the capture hook costs nothing while no timer expires
            hooked = []
            for _ in range(args.repeat):
                with hosted("ours-py-spy") as host:
                    hooked.append(throughput(host, writer, processes, args.requests)[2])
            results["ours"][f"server CPU/request, capture hook, 1 {writer} client(s)"] = (
                statistics.median(hooked)
            )
        if "torch" in results:
            results["torch"][f"throughput, {processes} own client(s)"] = results["torch"][
                f"throughput, {processes} {writer} client(s)"
            ]
    units = {
        "expiry": ("ms", True),
        "throughput": ("req/s", False),
        "pipe": ("errors", True),
        "idle": ("% of a core", True),
        "server": ("µs", True),
        "reap": ("ms", True),
    }
    print(f"{'measure':<38} {'aioelastic':>12} {'torch':>12} {'ratio':>8}")
    for name, ours in results["ours"].items():
        unit, lower = units[name.split()[0].rstrip(",")]
        torch = results.get("torch", {}).get(name)
        print(row(name, ours, torch, unit, lower))
    print(
        f"(torch: max_interval={TORCH_INTERVAL}; ratio > 1 means aioelastic is better; "
        "a shared 2-core machine, so figures are noisy)"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "host":
        kind = sys.argv[2]
        if kind.startswith("ours-"):
            host_ours(sys.argv[3], capture_with=kind.removeprefix("ours-"))
        elif kind.startswith("ours@"):
            host_ours(sys.argv[3], coalesce=float(kind.removeprefix("ours@")))
        else:
            {"ours": host_ours, "torch": host_torch}[kind](sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
