"""Three simulated nodes run real agents in one event loop; one node crashes; see what happened.

The test kit's RendezvousCluster gives each node an elastic rendezvous handler over one
in-memory store and a real ElasticAgent with two worker processes. Node 2 is crashed; the
others regroup without it. Every event goes to events.jsonl, and with matplotlib installed
`aioelastic timeline events.jsonl -o timeline.png` draws the run. Usage:
python examples/observability_cluster.py [OUTPUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from aioelastic.agent import WorkerSpec
from aioelastic.events import JsonLinesWriter, read_event_log
from aioelastic.testing import EventRecorder, Node, RendezvousCluster

WORKER = """\
import os, signal
if os.environ["GROUP_WORLD_SIZE"] == "3":
    signal.pause()  # the three-node job runs until a node is lost
"""


async def main(out: Path) -> None:
    worker = out / "worker.py"
    worker.write_text(WORKER)

    def spec(node: Node) -> WorkerSpec:
        args = ("-u", str(worker))
        return WorkerSpec(sys.executable, node.handler, args=args, local_world_size=2)

    recorder = EventRecorder()
    with JsonLinesWriter(out / "events.jsonl") as log, anyio.fail_after(60):
        async with RendezvousCluster(3, min_nodes=2, max_nodes=3) as cluster:
            cluster.events.subscribe(log)
            cluster.events.subscribe(recorder)
            await cluster.start_agents(spec)
            for node in cluster.nodes:
                await recorder.wait_for("WorkersStarted", node=node.name)
            print("three nodes, six workers running")
            await cluster.crash(cluster.nodes[2])
            print("node2 crashed")
            await cluster.advance(cluster.settings.heartbeat_timeout + 1)
            for node in cluster.nodes[:2]:
                await recorder.wait_for("WorkersStopped", node=node.name)
            await anyio.wait_all_tasks_blocked()
            await cluster.advance(cluster.settings.last_call_timeout + 1)
            for result in await cluster.wait_agents(cluster.nodes[:2]):
                print(f"survivor: {result.state.value}, restarts {result.restart_count}")
    kinds = [event.kind for event in read_event_log(out / "events.jsonl")]
    print(f"{len(kinds)} events in {out / 'events.jsonl'}: {kinds.count('NodeLost')} NodeLost")


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1] if len(sys.argv) > 1 else "."))
