"""The in-process watchdog: tasks run under ``timer.expires`` against a LocalTimerServer; the
one that hangs is cancelled and raises ScopeExpiredError.

    python examples/timer_tasks.py
"""

from __future__ import annotations

import anyio

from aioelastic import timer


async def step(name: str, seconds: float) -> None:
    try:
        async with timer.expires(after=0.2, scope=name):
            await anyio.sleep(seconds)
        print(f"{name}: done")
    except timer.ScopeExpiredError as exc:
        print(f"{name}: {exc}")


async def main() -> None:
    async with timer.LocalTimerServer("example") as server:
        timer.configure(server.client())
        async with anyio.create_task_group() as group:
            group.start_soon(step, "quick", 0.01)
            group.start_soon(step, "hung", 3600)
        print(server.statistics())


if __name__ == "__main__":
    anyio.run(main)
