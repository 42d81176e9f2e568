"""Stress: ``aioelastic store-server`` killed and restarted under live clients.

The server keeps its keys in memory, so a restart loses them (like torch's TCPStore); what must
hold is that clients reconnect by themselves, that no add is applied twice (the values one
server incarnation acknowledges are all distinct), and that every write acknowledged by the
last incarnation is there at the end.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections import Counter
from typing import Any

import anyio
import pytest

from aioelastic.store import StoreConnectionError, TCPStore
from stress.conftest import Figures

RESTARTS = 10
CLIENTS = 4


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_server(port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "aioelastic", "store-server", "--port", str(port)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def kill_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


async def start_server(port: int) -> subprocess.Popen[bytes]:
    proc = spawn_server(port)
    assert proc.stdout is not None
    with anyio.fail_after(60):
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
    assert b"listening" in line, line
    return proc


class Progress:
    """Wakes the restarter once the current incarnation has acknowledged enough adds."""

    def __init__(self, per_incarnation: int) -> None:
        self.per_incarnation = per_incarnation
        self.generation = -1
        self.reached = anyio.Event()

    def clear_for(self, generation: int) -> None:
        self.generation, self.reached = generation, anyio.Event()

    def note(self, generation: int, acknowledged: int) -> None:
        if generation == self.generation and acknowledged >= self.per_incarnation:
            self.reached.set()


@pytest.mark.anyio
@pytest.mark.timeout(900)
async def test_clients_survive_server_restarts(figures: Figures) -> None:
    """Clients reconnect after each SIGKILL and restart; no add applied twice; last writes kept."""
    port = free_port()
    generation = 0
    acked_adds: dict[int, list[int]] = {}
    acked_sets: dict[int, dict[str, bytes]] = {}
    errors: Counter[str] = Counter()
    ambiguous = 0
    stop = anyio.Event()
    ops_after_last_restart = Counter[int]()
    server = await start_server(port)
    progress = Progress(per_incarnation=300)

    async def client(i: int) -> None:
        nonlocal ambiguous
        n = 0
        async with TCPStore("127.0.0.1", port, timeout=60, connect_timeout=60) as store:
            while not stop.is_set():
                n += 1
                start = generation
                try:
                    value = await store.add("counter", 1)
                    key, data = f"c{i}/{n}", f"{i}:{n}".encode()
                    await store.set(key, data)
                except StoreConnectionError as exc:
                    errors[type(exc).__name__] += 1
                    continue
                if generation != start:
                    ambiguous += 1
                    continue
                acked_adds.setdefault(start, []).append(value)
                progress.note(start, len(acked_adds[start]))
                acked_sets.setdefault(start, {})[key] = data
                if start == RESTARTS:
                    ops_after_last_restart[i] += 1
                    if min(ops_after_last_restart[c] for c in range(CLIENTS)) >= 200:
                        stop.set()

    try:
        async with anyio.create_task_group() as group:
            for i in range(CLIENTS):
                group.start_soon(client, i)
            for _ in range(RESTARTS):
                progress.clear_for(generation)
                with anyio.fail_after(120):
                    await progress.reached.wait()
                kill_server(server)
                generation += 1
                server = await start_server(port)
            with anyio.fail_after(300):
                await stop.wait()
        async with TCPStore("127.0.0.1", port) as store:
            final_counter = int(await store.get("counter"))
            last = acked_sets.get(RESTARTS, {})
            kept = await store.multi_get(list(last)) if last else []
    finally:
        kill_server(server)
    duplicates = sum(len(v) - len(set(v)) for v in acked_adds.values())
    lost_last = sum(1 for (k, v), got in zip(last.items(), kept, strict=True) if v != got)
    figures["restarts (SIGKILL)"] = RESTARTS
    figures["acknowledged adds"] = sum(len(v) for v in acked_adds.values())
    figures["acknowledged sets"] = sum(len(v) for v in acked_sets.values())
    figures["calls failed with a connection error"] = dict(errors)
    figures["calls spanning a restart (not counted)"] = ambiguous
    figures["adds applied twice"] = duplicates
    figures["last incarnation: writes acknowledged / lost"] = (len(last), lost_last)
    figures["last incarnation: counter / acknowledged adds"] = (
        final_counter,
        len(acked_adds.get(RESTARTS, [])),
    )
    assert duplicates == 0
    assert lost_last == 0
    assert final_counter >= len(acked_adds.get(RESTARTS, []))
    assert all(ops_after_last_restart[c] >= 200 for c in range(CLIENTS))
