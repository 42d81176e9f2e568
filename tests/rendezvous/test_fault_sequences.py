"""Seeded kill / pause / resume / start sequences (the chaos stress run, in one loop on a manual
clock): after every fault the rendezvous completes a new round with ranks 0..N-1."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import anyio
import pytest

from aioelastic.rendezvous import RendezvousError
from aioelastic.testing import Node, RendezvousCluster, Stall

pytestmark = pytest.mark.anyio

TIMINGS = {"last_call_timeout": 0.5, "heartbeat_timeout": 3.0, "keep_alive_interval": 0.5}
PAUSE_DELAYS = [0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.5, 0.55, 0.7, 1.0]
"""When a pause may hit after a new node arrived: before, during and after the last call."""
ROUND_BOUND = 30.0
"""Simulated seconds a fault may take to lead to a new round (a lost member needs about
heartbeat_timeout + last_call_timeout; a resumed one, a last call)."""


@pytest.fixture
def anyio_backend() -> str:
    """trio only: anyio's wait_all_tasks_blocked polls every 0.1 s of real time on asyncio."""
    return "trio"


@dataclass
class Rounds:
    """Which nodes completed which round, as the agents' workers would report it."""

    ranks: dict[int, dict[int, int]] = field(default_factory=dict)  # round -> node -> rank
    sizes: dict[int, int] = field(default_factory=dict)

    def add(self, round_: int, node: int, rank: int, world_size: int) -> None:
        ranks = self.ranks.setdefault(round_, {})
        assert node not in ranks, f"node {node} completed round {round_} twice"
        ranks[node] = rank
        assert self.sizes.setdefault(round_, world_size) == world_size

    def complete(self) -> set[int]:
        return {r for r, ranks in self.ranks.items() if len(ranks) == self.sizes[r]}


@dataclass
class Member:
    """A node run the way the agent runs it; pausing it stops its store calls and itself."""

    node: Node
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    running: anyio.Event = field(default_factory=anyio.Event)
    stall: Stall | None = None

    async def run(self, rounds: Rounds) -> None:
        """Join, run until the round is invalid, join again (as the agent does)."""
        handler = self.node.handler
        self.running.set()
        with self.scope:
            while True:
                try:
                    info = await handler.next_rendezvous()
                except RendezvousError:
                    return  # its store is gone (the node was killed)
                await self.running.wait()
                rounds.add(handler.statistics().round, handler.node_id, info.rank, info.world_size)
                await handler.wait_round_invalidated()
                await self.running.wait()

    def pause(self) -> None:
        self.running = anyio.Event()
        self.stall = self.node.store.stall()

    def resume(self) -> None:
        assert self.stall is not None
        self.stall.release()
        self.running.set()


async def run_faults(seed: int, faults: int) -> Counter[str]:
    """Inject ``faults`` faults chosen by ``seed``; after each, wait for a new complete round."""
    rng = random.Random(seed)
    rounds = Rounds()
    kinds: Counter[str] = Counter()
    async with (
        RendezvousCluster(4, min_nodes=2, max_nodes=8, **TIMINGS) as cluster,
        anyio.create_task_group() as tg,
    ):
        members: list[Member] = []
        paused: list[Member] = []

        async def start() -> Member:
            member = Member(await cluster.add_node())
            members.append(member)
            tg.start_soon(member.run, rounds)
            return member

        async def next_round(seen: set[int], after: str) -> None:
            waited = 0.0
            while not rounds.complete() - seen:
                assert waited < ROUND_BOUND, (
                    f"no round completed {ROUND_BOUND} s after fault {after} "
                    f"(faults so far {dict(kinds)}; nodes {cluster.nodes})"
                )
                await cluster.advance(0.25)
                waited += 0.25

        for node in cluster.nodes:
            member = Member(node)
            members.append(member)
            tg.start_soon(member.run, rounds)
        await next_round(set(), "start")
        for step in range(faults):
            seen = rounds.complete()
            live = [m for m in members if m not in paused]
            if paused:
                kind = "resume"
            else:
                kind = rng.choice(["kill", "pause", "start"])
                if len(live) <= 2:
                    kind = "start"
                elif len(live) >= 6:
                    kind = "kill"
            kinds[kind] += 1
            if kind == "kill":
                victim = rng.choice(live)
                members.remove(victim)
                victim.scope.cancel()
                await cluster.crash(victim.node)
            elif kind == "pause":  # SIGSTOP
                if rng.random() < 0.5:  # in the middle of a rendezvous
                    live.append(await start())
                    await cluster.advance(rng.choice(PAUSE_DELAYS), step=0.05)
                    seen = rounds.complete()
                victim = rng.choice(live)
                victim.pause()
                paused.append(victim)
            elif kind == "resume":
                paused.pop().resume()
            else:
                await start()
            await next_round(seen, f"#{step} ({kind})")
        for round_ in rounds.complete():
            assert sorted(rounds.ranks[round_].values()) == list(range(rounds.sizes[round_]))
        for member in members:
            if member.stall is not None:
                member.stall.release()
            member.scope.cancel()
    return kinds


@pytest.mark.parametrize("seed", [11, 12])
async def test_every_fault_is_followed_by_a_new_round(seed: int) -> None:
    """Kills, pauses past the heartbeat, resumes and new nodes: each leads to a new round."""
    kinds = await run_faults(seed, faults=200)
    assert set(kinds) == {"kill", "pause", "resume", "start"}
