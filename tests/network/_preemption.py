"""A preemption trial on three network-namespace hosts, two workers each: used by
``tests/network/test_preemption.py`` and by the loop in ``stress/``.

The workers write what they did to files in a shared directory (the file system crosses
namespaces): on the worker API, ``rank-N.json`` with the step it saved at; plain workers,
``rank-N.handled`` from their SIGTERM handler. Each agent appends its events to
``events-HOST.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from aioelastic.events import read_event_log
from aioelastic.testing import Host, Network
from tests.network._job import Collector, Job

CONF = "heartbeat_timeout=5,keep_alive_interval=0.5,last_call_timeout=0.5"

API_WORKER = """
import itertools, json, os, time
from pathlib import Path
from aioelastic import worker
gloo = os.environ.get("GLOO") == "1"
if gloo:
    import torch
    import torch.distributed as dist
out = Path(os.environ["OUT"])
hang_rank = int(os.environ.get("HANG_RANK", "-1"))
for world in worker.worlds():
    with world:
        if gloo:
            world.init_process_group("gloo")
        for step in itertools.count():
            if world.should_stop(step):
                record = {"step": step, "host": os.environ["HOST_ADDR"], "pid": os.getpid()}
                (out / f"rank-{world.rank}.json").write_text(json.dumps(record))
                print(f"rank {world.rank} saved at step {step}", flush=True)
                break
            if step == 3:
                print(f"rank {world.rank} training", flush=True)
            if world.rank == hang_rank and step == 5:
                print(f"rank {world.rank} hangs", flush=True)
                time.sleep(600)
            if gloo:
                dist.all_reduce(torch.ones(1))
            time.sleep(0.01)  # the step's compute  # pace
"""
"""A worker on the API: one step a loop (an all_reduce under ``GLOO=1``); ``HANG_RANK`` hangs
in its step 5 (it never reaches another boundary)."""

PLAIN_WORKER = """
import os, signal, sys, time
from pathlib import Path
out = Path(os.environ["OUT"])
rank = os.environ["RANK"]
def save(signum, frame):
    print(f"rank {rank}: {signal.Signals(signum).name}, saving", flush=True)
    (out / f"rank-{rank}.handled").write_text(os.environ["HOST_ADDR"])
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print(f"rank {rank} training", flush=True)
while True:
    time.sleep(0.05)  # training until the signal  # pace
"""
"""A plain worker (no API) whose SIGTERM handler saves and exits 0."""


@dataclass
class Trial:
    net: Network
    job: Job
    out: Path
    tg: anyio.abc.TaskGroup
    endpoint: str = ""

    def saved(self) -> dict[int, dict[str, Any]]:
        """Rank -> what it wrote on the API."""
        return {
            int(path.stem.removeprefix("rank-")): json.loads(path.read_text())
            for path in self.out.glob("rank-*.json")
        }

    def handled(self) -> dict[int, str]:
        """Rank -> the host whose plain worker ran its SIGTERM handler."""
        return {
            int(path.stem.removeprefix("rank-")): path.read_text()
            for path in self.out.glob("rank-*.handled")
        }

    def events(self, host: Host, kind: str) -> list[dict[str, Any]]:
        """The ``kind`` events the agent on ``host`` logged."""
        path = self.out.parent / f"events-{host.addr}.jsonl"
        return [dict(e.data) for e in read_event_log(path) if e.kind == kind]

    async def start(
        self, backend: str, script: str, *, options: Sequence[str] = (), lines: int = 6
    ) -> None:
        """Start the job on every host; return once ``lines`` workers said they train."""
        hosts = self.net.hosts
        endpoint = self.endpoint = await self.job.endpoint(backend, hosts)
        path = self.out.parent / "worker.py"
        path.write_text(script)
        for host in hosts:
            events = self.out.parent / f"events-{host.addr}.jsonl"
            await self.job.start(
                self.tg,
                [host],
                backend=backend,
                endpoint=endpoint,
                conf=CONF,
                nnodes="3",
                options=["--nproc-per-node", "2", "--events-file", str(events), *options],
                script=path,
            )
        await self.wait_count(" training", lines)

    async def wait_count(self, text: str, count: int) -> None:
        """Until the consoles hold ``text`` on ``count`` lines in all."""
        job = self.job
        with anyio.move_on_after(60):
            while sum(a.console.count(text) for a in job.agents) < count:
                await job._changed.wait()
            return
        raise AssertionError(f"not {count} lines with {text!r}\n{job.consoles()}")

    async def status(self, backend: str) -> str:
        """``aioelastic status`` of the job, run on host 0."""
        argv = [sys.executable, "-m", "aioelastic", "status", "--rdzv-backend", backend]
        argv += ["--rdzv-endpoint", self.endpoint, "--rdzv-id", "job"]
        done = await self.net.hosts[0].run(argv)
        return done.stdout.decode()

    async def preempt(self, host: Host, signum: int = signal.SIGTERM) -> list[int | None]:
        """Signal the agent on ``host``; return every agent's exit status once all exited."""
        self.job.agent(host).process.send_signal(signum)
        with anyio.move_on_after(60):
            return [await agent.process.wait() for agent in self.job.agents]
        raise AssertionError(f"the agents did not all exit\n{self.job.consoles()}")


@asynccontextmanager
async def trial(*, gloo: bool = False, hang_rank: int = -1) -> AsyncIterator[Trial]:
    """Three hosts and a directory for the workers' files (short: UNIX socket paths are)."""
    workdir = Path(tempfile.mkdtemp(prefix="aioe-"))
    out = workdir / "out"
    out.mkdir()
    env = {"OUT": str(out), "GLOO": "1" if gloo else "0", "HANG_RANK": str(hang_rank)}
    if gloo:
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # the hosts share a host name: use eth0
    try:
        with _environ(env):
            async with Network(3) as net, anyio.create_task_group() as tg:
                job = Job(net, workdir, Collector(workdir / "unused.sock"))
                yield Trial(net, job, out, tg)
                await job.stop()
                tg.cancel_scope.cancel()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` (the agents inherit them); restore it after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
