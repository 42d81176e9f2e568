"""c10d across real processes: a round forms, and a killed node invalidates it for the others."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from contextlib import ExitStack

from tests.rendezvous.test_backends import unused_port

NODE = """
import json, sys, anyio
from aioelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

async def main(port: int, is_host: str) -> None:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", "job", 3, 3, local_addr="127.0.0.1", is_host=is_host,
        keep_alive_interval="0.2", heartbeat_timeout="1",
    )
    async with get_rendezvous_handler(params) as handler:
        info = await handler.next_rendezvous()
        print(json.dumps({"rank": info.rank, "size": info.world_size}), flush=True)
        verdict = await handler.wait_round_invalidated()
        print(json.dumps({"reason": verdict.reason.name}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)  # stay until told (node 0 hosts)

anyio.run(main, int(sys.argv[1]), sys.argv[2])
"""


def test_a_killed_process_invalidates_the_round_of_the_others() -> None:
    """Three c10d processes form a round; SIGKILL one: the others learn PARTICIPANT_LOST."""
    port = unused_port()
    with ExitStack() as stack:
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", NODE, str(port), "true" if index == 0 else "false"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            for index in range(3)
        ]
        for proc in procs:  # on the way out: kill what is left (Popen's exit then waits)
            stack.callback(lambda p=proc: p.poll() is None and p.kill())
        rounds = [json.loads(line(proc)) for proc in procs]
        assert sorted(r["rank"] for r in rounds) == [0, 1, 2]
        assert {r["size"] for r in rounds} == {3}
        procs[2].send_signal(signal.SIGKILL)  # no goodbye: only its expired key tells
        verdicts = [json.loads(line(proc)) for proc in procs[:2]]
        assert verdicts == [{"reason": "PARTICIPANT_LOST"}] * 2
        for proc in (procs[1], procs[0]):  # node 0 hosts the store: it leaves last
            assert proc.stdin is not None
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0  # generous: a node leaves at once


def line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline()
