"""A real elastic job across network-namespace hosts, watched through its workers' own records.

Each host runs ``aioelastic run`` with plain-Python workers (:data:`WORKER`). A worker tells
the test's :class:`Collector` who it is (host, round, rank, world size, pid, from its own
environment) over a UNIX socket, which crosses network namespaces (it lives in the file
system), and holds the connection open: the connection closes the moment the worker dies, so
the collector knows which workers are alive at every instant without polling. It records
every moment two live workers of different rounds claim the same rank (a *split brain*).

The agents' console lines are read as they come, so a test waits for "fenced" or for a world
of a given size without sleeping. Used by ``tests/network`` and ``stress/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from aioelastic.agent._forensics import find_py_spy
from aioelastic.testing import HOW_TO_GET_ETCD, Host, Network, find_etcd_binary

WITHIN = 60.0
"""How long a wait gives its condition by default: half of pytest-timeout's 120 s, so a test that
waits in vain fails with the agents' consoles instead of a bare timeout."""

WORKER = """
import json, os, socket, sys, time
sock = socket.socket(socket.AF_UNIX)
sock.connect(os.environ["COLLECTOR"])
record = {name.lower(): os.environ.get(name, "") for name in
          ("HOST_ADDR", "AIOELASTIC_ROUND", "RANK", "WORLD_SIZE", "GROUP_RANK")}
record.update(pid=os.getpid(), started=time.time())
sock.sendall(json.dumps(record).encode() + b"\\n")
beat = float(os.environ.get("BEAT", "0"))
while True:
    if beat:
        time.sleep(beat)  # the heartbeat's period  # pace
        sock.sendall(b"beat\\n")
    elif not sock.recv(1):
        sys.exit(0)
"""
"""A worker: reports itself, then beats every ``$BEAT`` s (or just waits) until killed."""


class NotWithin(AssertionError):
    """A wait of :meth:`Collector.wait_for` ran out (a test failure, unless caught)."""


@dataclass
class Worker:
    """One worker's own record, and when the collector saw it end."""

    host: str
    round: int
    rank: int
    world_size: int
    pid: int
    started: float
    ended: float | None = None
    beats: int = 0


@dataclass
class SplitBrain:
    """Two live workers of different rounds held the same rank at ``at``."""

    rank: int
    at: float
    workers: tuple[Worker, Worker]


class Collector:
    """Serves the workers' records on a UNIX socket; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.workers: list[Worker] = []
        self.split_brains: list[SplitBrain] = []
        self._changed = anyio.Event()
        self.describe: Callable[[], str] = lambda: ""
        """What a wait that timed out shows (a :class:`Job` sets its agents' consoles)."""

    @property
    def live(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.ended is None]

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_unix_listener(self.path)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            lines = BufferedByteReceiveStream(stream)
            try:
                fields = json.loads(await lines.receive_until(b"\n", 4096))
            except (anyio.EndOfStream, anyio.IncompleteRead, OSError):
                return  # killed before it said who it is: it never ran as any rank
            worker = Worker(
                fields["host_addr"],
                int(fields["aioelastic_round"] or 0),
                int(fields["rank"]),
                int(fields["world_size"]),
                int(fields["pid"]),
                float(fields["started"]),
            )
            for other in self.live:
                if other.pid == worker.pid:  # one process, its next world: it left the last
                    other.ended = time.time()
                elif other.rank == worker.rank and other.round != worker.round:
                    self.split_brains.append(SplitBrain(worker.rank, time.time(), (other, worker)))
            self.workers.append(worker)
            self._notify()
            try:
                while True:
                    await lines.receive_until(b"\n", 64)
                    worker.beats += 1
                    self._notify()
            except (anyio.EndOfStream, anyio.IncompleteRead, OSError):
                pass
            worker.ended = time.time()
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, condition: Callable[[], Any], *, within: float = WITHIN) -> Any:
        """Return ``condition()`` once it is truthy, re-checked on every change of the records."""
        with anyio.move_on_after(within):
            while not (outcome := condition()):
                await self._changed.wait()
            return outcome
        raise NotWithin(f"not so within {within:g} s; live: {self.live}\n{self.describe()}")

    def world(self, hosts: Iterable[Host], *, size: int | None = None) -> list[Worker] | None:
        """The live workers, if exactly ``hosts`` run one world of one round (else None)."""
        addrs = sorted(host.addr for host in hosts)
        live = self.live
        if sorted(w.host for w in live) != addrs or len({w.round for w in live}) != 1:
            return None
        expected = len(addrs) if size is None else size
        if any(w.world_size != expected for w in live):
            return None
        if sorted(w.rank for w in live) != list(range(expected)):
            return None
        return live


@dataclass
class Agent:
    """One ``aioelastic run`` on a host, its console read line by line as it comes."""

    host: Host
    process: anyio.abc.Process
    lines: list[tuple[float, str]] = field(default_factory=list)

    def said(self, text: str, after: float = 0.0) -> float | None:
        """When the agent first printed a line containing ``text`` after ``after``."""
        return next((t for t, line in self.lines if text in line and t >= after), None)

    @property
    def console(self) -> str:
        return "\n".join(line for _, line in self.lines)


class Job:
    """Agents of one job on ``hosts``, their workers reporting to a :class:`Collector`."""

    def __init__(self, net: Network, workdir: Path, collector: Collector) -> None:
        self.net = net
        self.workdir = workdir
        self.collector = collector
        collector.describe = self.consoles
        self.agents: list[Agent] = []
        self.etcd: list[anyio.abc.Process] = []
        self._changed = anyio.Event()
        self.script = workdir / "worker.py"
        self.script.write_text(WORKER)

    async def start(
        self,
        tg: anyio.abc.TaskGroup,
        hosts: Sequence[Host],
        *,
        backend: str,
        endpoint: str,
        conf: str,
        nnodes: str,
        beat: float = 0.0,
        options: Sequence[str] = (),
        script: Path | None = None,
    ) -> None:
        """Start an agent on each of ``hosts`` (``options`` added to its flags) running
        ``script`` (default: :data:`WORKER`)."""
        for host in hosts:
            env = {
                **os.environ,
                "COLLECTOR": str(self.collector.path),
                "HOST_ADDR": host.addr,
                "BEAT": str(beat),
                "PYTHONUNBUFFERED": "1",
            }
            argv = [
                sys.executable, "-m", "aioelastic", "run",
                "--nnodes", nnodes, "--nproc-per-node", "1",
                "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", "job",
                "--rdzv-conf", conf, "--local-addr", host.addr, "--max-restarts", "0",
                *options, str(script or self.script),
            ]  # fmt: skip
            process = await host.start(
                argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
            agent = Agent(host, process)
            self.agents.append(agent)
            tg.start_soon(self._read, agent)

    async def _read(self, agent: Agent) -> None:
        assert agent.process.stdout is not None
        lines = BufferedByteReceiveStream(agent.process.stdout)
        try:
            while True:
                line = await lines.receive_until(b"\n", 1 << 20)
                agent.lines.append((time.time(), line.decode(errors="replace")))
                self._changed.set()
                self._changed = anyio.Event()
        except (anyio.EndOfStream, anyio.IncompleteRead):
            pass

    def agent(self, host: Host) -> Agent:
        return next(agent for agent in self.agents if agent.host == host)

    async def wait_said(
        self, host: Host, text: str, *, after: float = 0.0, within: float = WITHIN
    ) -> float:
        """When the agent on ``host`` printed ``text`` (after ``after``), once it has."""
        agent = self.agent(host)
        with anyio.move_on_after(within):
            while (found := agent.said(text, after)) is None:
                await self._changed.wait()
            return found
        raise AssertionError(
            f"{host.addr} never said {text!r} within {within:g} s\n{self.consoles()}"
        )

    async def stop(self) -> None:
        """SIGTERM every agent, then wait for all of them (SIGKILL by the network's clean-up)."""
        for agent in self.agents:
            if agent.process.returncode is None:
                agent.process.terminate()
        with anyio.move_on_after(30):
            for agent in self.agents:
                await agent.process.wait()
        for process in [agent.process for agent in self.agents] + self.etcd:
            if process.returncode is None:
                process.kill()
            await process.aclose()

    async def endpoint(self, backend: str, members: Sequence[Host]) -> str:
        """The rendezvous endpoint: c10d's store on the first of ``members``, or an etcd member
        started on each (skips without an etcd binary, fails so under CI)."""
        if backend == "c10d":
            return f"{members[0].addr}:29400"
        binary = find_etcd_binary()
        if binary is None:
            message = f"no etcd binary: {HOW_TO_GET_ETCD}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true but {message}")
            pytest.skip(message)
        return await self.start_etcd(members, binary)

    async def start_etcd(self, hosts: Sequence[Host], binary: str) -> str:
        """Start one etcd member on each of ``hosts`` (client port 2379, peers on 2380);
        return the agents' endpoint list. The agents' store retries until they serve."""
        peers = ",".join(f"m{h.index}=http://{h.addr}:2380" for h in hosts)
        for host in hosts:
            client, peer = f"http://{host.addr}:2379", f"http://{host.addr}:2380"
            data = self.workdir / f"m{host.index}"
            argv = [
                binary, "--name", f"m{host.index}", "--data-dir", str(data),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-token", self.workdir.name,
                "--initial-cluster-state", "new",
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--pre-vote",  # (3.5 default) the cut host's member must not depose the leader
                "--logger", "zap", "--log-outputs", "stderr",
            ]  # fmt: skip
            with (self.workdir / f"etcd-{host.index}.log").open("wb") as log:
                member = await host.start(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self.etcd.append(member)
        return ",".join(f"{h.addr}:2379" for h in hosts)

    def consoles(self) -> str:
        """Every agent's console, for a failure message."""
        return "\n".join(f"--- {a.host.addr}\n{a.console}" for a in self.agents)

    async def hang_report(self) -> str:
        """For a wait that ran out: the live workers, every agent's console and the Python
        stacks of the agents still running (py-spy, as the agent's own forensics finds it),
        so that a hang seen once can be read afterwards."""
        live = "\n".join(
            f"{w.host} pid {w.pid} round {w.round} rank {w.rank} of {w.world_size}"
            for w in self.collector.live
        )
        parts = [f"--- live workers\n{live}", self.consoles()]
        py_spy = find_py_spy("auto")
        for agent in self.agents:
            if agent.process.returncode is not None:
                continue
            if py_spy is None:
                parts.append(f"--- stacks of {agent.host.addr}: no py-spy to take them")
                continue
            with anyio.move_on_after(30):
                done = await anyio.run_process(
                    [py_spy, "dump", "--pid", str(agent.process.pid)], check=False
                )
                parts.append(
                    f"--- stacks of {agent.host.addr} (pid {agent.process.pid})\n"
                    + (done.stdout or done.stderr).decode(errors="replace")
                )
        return "\n".join(parts)
