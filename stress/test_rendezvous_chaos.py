"""Stress: real `aioelastic run` agents over c10d (a separate store server) under kills,
SIGSTOP/SIGCONT and restarts; after each fault the next completed round is checked.

Each worker prints one ``JOIN`` line with its rank, world size and the round's master port;
a round is the set of workers sharing a master port. A completed round must have ranks
0..WORLD_SIZE-1 exactly once, and all its workers must agree on the world size.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from stress.conftest import Figures
from stress.test_store_restart import free_port, kill_server, start_server

ROUNDS = 200
AGENTS = 4
WORKER = """
import json, os, threading
keys = ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_PORT")
print("JOIN " + json.dumps({k: os.environ[k] for k in keys}), flush=True)
threading.Event().wait()
"""


@pytest.fixture
def anyio_backend() -> Any:
    return ("asyncio", {})


class Rounds:
    """Collects JOIN lines into rounds; wakes waiters on each line."""

    def __init__(self) -> None:
        self.by_port: dict[str, list[dict[str, str]]] = {}
        self.changed = anyio.Event()

    def add(self, record: dict[str, str]) -> None:
        self.by_port.setdefault(record["MASTER_PORT"], []).append(record)
        self.changed.set()
        self.changed = anyio.Event()

    def complete(self) -> dict[str, list[dict[str, str]]]:
        return {
            port: records
            for port, records in self.by_port.items()
            if len(records) == int(records[0]["WORLD_SIZE"])
        }


def violations(records: list[dict[str, str]]) -> list[str]:
    sizes = {r["WORLD_SIZE"] for r in records} | {r["GROUP_WORLD_SIZE"] for r in records}
    ranks = sorted(int(r["RANK"]) for r in records)
    found = []
    if len(sizes) != 1:
        found.append(f"world sizes disagree: {sizes}")
    if ranks != list(range(len(records))):
        found.append(f"ranks not 0..N-1 once each: {ranks}")
    return found


@pytest.mark.anyio
@pytest.mark.timeout(1200)
async def test_rendezvous_survives_kills_pauses_and_restarts(
    tmp_path: Path, figures: Figures
) -> None:
    """Every completed round has unique contiguous ranks; no round after a fault hangs."""
    rng = random.Random(11)
    port = free_port()
    server = await start_server(port)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [sys.executable, "-m", "aioelastic", "run", "--nnodes", "2:8"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    command += ["--rdzv-id", "chaos", "--max-restarts", "100000", "--rdzv-conf"]
    command += ["last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5"]
    command += [str(script)]
    rounds = Rounds()
    agents: list[anyio.abc.Process] = []
    stopped: list[anyio.abc.Process] = []
    faults: Counter[str] = Counter()
    waits: list[float] = []
    hung = 0
    hung_after: Counter[str] = Counter()

    async def read(agent: anyio.abc.Process) -> None:
        assert agent.stdout is not None
        buffer = b""
        async for chunk in agent.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                _, found, payload = line.partition(b"JOIN ")
                if found:
                    rounds.add(json.loads(payload))

    async def start(group: anyio.abc.TaskGroup) -> None:
        agent = await anyio.open_process(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        agents.append(agent)
        group.start_soon(read, agent)

    async def next_round(seen: set[str], action: str = "start") -> None:
        nonlocal hung
        began = anyio.current_time()
        with anyio.move_on_after(120) as scope:
            while not set(rounds.complete()) - seen:
                await rounds.changed.wait()
        if scope.cancelled_caught:
            hung += 1
            hung_after[action] += 1
        waits.append(anyio.current_time() - began)

    try:
        async with anyio.create_task_group() as group:
            for _ in range(AGENTS):
                await start(group)
            await next_round(set())
            for _ in range(ROUNDS):
                seen = set(rounds.complete())
                live = [a for a in agents if a.returncode is None and a not in stopped]
                if stopped:
                    action = "sigcont"
                else:
                    action = rng.choice(["sigkill", "sigstop", "restart"])
                    if len(live) <= 2:
                        action = "restart"
                    elif len(live) >= 6:
                        action = "sigkill"
                faults[action] += 1
                if action == "sigkill":
                    victim = rng.choice(live)
                    victim.kill()
                    await victim.wait()
                    agents.remove(victim)
                elif action == "sigstop":
                    victim = rng.choice(live)
                    victim.send_signal(signal.SIGSTOP)
                    stopped.append(victim)
                elif action == "sigcont":
                    stopped.pop().send_signal(signal.SIGCONT)
                else:
                    await start(group)
                await next_round(seen, action)
            group.cancel_scope.cancel()
    finally:
        for agent in agents:
            if agent.returncode is None:
                agent.send_signal(signal.SIGCONT)
                agent.kill()
                await agent.wait()
            await agent.aclose()
        kill_server(server)
    complete = rounds.complete()
    found = [v for records in complete.values() for v in violations(records)]
    figures["faults injected"] = dict(faults)
    figures["rounds completed"] = len(complete)
    figures["rounds never completed (a member died first)"] = len(rounds.by_port) - len(complete)
    figures["world sizes seen"] = dict(Counter(len(r) for r in complete.values()))
    figures["invariant violations"] = found
    figures["fault-to-next-round waits over 120 s"] = hung
    figures["faults after which no round completed within 120 s"] = dict(hung_after)
    figures["slowest fault-to-next-round (s)"] = round(max(waits), 1)
    assert found == []
    if hung:
        pytest.xfail(
            f"rendezvous: {hung} fault(s) ({dict(hung_after)}) were followed by no completed "
            "round within 120 s (reported for the rendezvous engineer)"
        )
