"""A watchdog in a few lines: a worker process runs steps under ``timer.expires``; one step
hangs, the FileTimerServer reaps the worker and says which scope expired.

    python examples/timer_watchdog.py
"""

from __future__ import annotations

import sys

import anyio

from aioelastic import timer

WORKER = """
import sys, threading
from aioelastic import timer

timer.configure(timer.FileTimerClient(sys.argv[1]))
for step in range(3):
    with timer.expires(after=0.5, scope=f"step-{step}"):
        if step == 2:
            threading.Event().wait()  # a hung step: only the watchdog ends this
    print(f"worker: step {step} done", flush=True)
"""


async def main() -> None:
    reaped = anyio.Event()
    reports: list[timer.TimerReaped] = []

    def on_event(event: timer.TimerEvent) -> None:
        if isinstance(event, timer.TimerReaped):
            reports.append(event)
            reaped.set()

    async with timer.FileTimerServer(None, "example", on_event=on_event) as server:
        worker = await anyio.open_process(
            [sys.executable, "-c", WORKER, server.file_path], stdout=None, stderr=None
        )
        async with worker:
            await reaped.wait()
            returncode = await worker.wait()
    report = reports[0]
    print(f"watchdog: pid {report.pid} reaped with signal {report.signal} ({report.scope_id!r})")
    print(f"worker exit code: {returncode}")


if __name__ == "__main__":
    anyio.run(main)
