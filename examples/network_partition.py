"""A real partition: three hosts (network namespaces, root only), one cut off, then healed.

Run as root: ``python examples/network_partition.py``. Three ``aioelastic run`` agents over
c10d (the store on host 0) each run one worker; host 2 is cut off. Its agent fences (kills its
worker before the other two re-form without it), the other two form a world of 2, and after
the heal all three are one world again. Every agent's console line is printed as it comes.
"""

from __future__ import annotations

import subprocess
import sys
import time

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from aioelastic.testing import Network, unavailable_reason

WORKER = "import os, time; print('round', os.environ['AIOELASTIC_ROUND']); time.sleep(600)"
CONF = "heartbeat_timeout=3,keep_alive_interval=0.5,last_call_timeout=0.5"


async def main() -> None:
    started = time.monotonic()
    seen: list[tuple[int, str]] = []
    changed = anyio.Event()

    async def relay(index: int, process: anyio.abc.Process) -> None:
        nonlocal changed
        assert process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)
        while True:
            try:
                line = (await lines.receive_until(b"\n", 1 << 16)).decode()
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return
            seen.append((index, line))
            print(f"{time.monotonic() - started:6.2f} host {index}: {line}", flush=True)
            changed.set()
            changed = anyio.Event()

    async def until(index: int, text: str, since: int) -> None:
        """Wait for host ``index`` to print ``text`` (in a line after the first ``since``)."""
        while not any(i == index and text in line for i, line in seen[since:]):
            await changed.wait()

    async with Network(3) as net, anyio.create_task_group() as tg:
        endpoint = f"{net.hosts[0].addr}:29400"
        agents = []
        for host in net.hosts:
            argv = [
                sys.executable, "-m", "aioelastic", "run", "--nnodes", "2:3",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "demo",
                "--rdzv-conf", CONF, "--local-addr", host.addr,
                "--no-python", sys.executable, "-c", WORKER,
            ]  # fmt: skip
            agent = await host.start(argv, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            agents.append(agent)
            tg.start_soon(relay, host.index, agent)
        with anyio.fail_after(120):
            for index in range(3):
                await until(index, "world size 3", 0)
            print("--- cutting host 2 off", flush=True)
            cut = len(seen)
            await net.cut(net.hosts[2])
            await until(2, "fenced:", cut)
            await until(0, "world size 2", cut)
            print("--- healing", flush=True)
            healed = len(seen)
            await net.heal()
            for index in range(3):
                await until(index, "world size 3", healed)
        print("--- back in one world of 3", flush=True)
        for agent in agents:
            agent.terminate()
        for agent in agents:
            await agent.wait()
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    reason = unavailable_reason()
    if reason is not None:
        sys.exit(f"cannot make network namespaces here: {reason}")
    anyio.run(main)
