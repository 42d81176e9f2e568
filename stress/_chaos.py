"""Rendezvous chaos harness: real `aioelastic run` agents under faults, every round checked.

One harness serves every rendezvous backend. It starts agents (one worker each) on a store the
caller runs, then injects faults one at a time, chosen at random: SIGKILL an agent, SIGSTOP one
(SIGCONT at the next step) or start a new one, keeping between ``min_live`` and ``max_live``
agents live (leaning toward a target that sweeps that range twice). Given
:class:`MemberFaults`, each step may also SIGKILL, SIGSTOP or bring back an etcd member (never
more than one member down or paused at a time, so quorum holds; a killed member restarts with
its data directory and must serve again).

Each worker prints one ``JOIN`` line with its rank, world size and its rendezvous round
(``AIOELASTIC_ROUND``); a round is the set of workers reporting the same round. (Not the master
port: with the agents' store, ``TORCHELASTIC_USE_AGENT_STORE``, each agent gives its workers its
own store's port.) A completed round must have ranks
0..WORLD_SIZE-1 exactly once, and all its workers must agree on the world size. After each
fault the harness waits (at most ``hang_bound``) for a new completed round. A SIGKILL or
SIGSTOP of an agent outside the latest round (still joining after that round sealed without
it) requires no new round: it is counted, not waited for. A wait that runs out is a hang: the
agents' states (their log tails, ``aioelastic status``, the etcd members)
are written to a ``stall-N.txt`` file next to the agents' logs and ``faults.log``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import anyio
import anyio.abc
import grpc

from aioelastic.testing import EtcdCluster, EtcdMember
from stress.conftest import Figures

RUN_ID = "chaos"
WORKER = """
import json, os, threading
keys = ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "AIOELASTIC_ROUND")
record = {k: os.environ[k] for k in keys} | {"AGENT": str(os.getppid())}
print("JOIN " + json.dumps(record), flush=True)
threading.Event().wait()
"""
FAULTS_ENV = "AIOELASTIC_CHAOS_FAULTS"
"""Overrides the number of faults of every chaos plan (for a short trial run)."""
SEED_ENV = "AIOELASTIC_CHAOS_SEED"
"""Overrides the seed of every chaos plan (to try other fault sequences)."""
LOG_LEVEL = os.environ.get("AIOELASTIC_CHAOS_LOGLEVEL", "INFO")
"""The agents' LOGLEVEL (DEBUG logs every rendezvous step, for a stall's post-mortem)."""
REJOIN_BOUND = 60.0
"""Seconds a restarted etcd member has to serve linearizable reads again."""


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    """What one chaos run does: how many faults, how many agents, how long to wait."""

    faults: int
    min_live: int
    max_live: int
    seed: int
    hang_bound: float = 120.0
    """Seconds after a fault within which a new round must complete."""
    time_budget: float = 720.0
    """Stop injecting faults after this many seconds (the run must fit in a stress file)."""
    rdzv_conf: str = "last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5"


def faults(default: int) -> int:
    """``default``, unless :data:`FAULTS_ENV` asks for another number of faults."""
    return int(os.environ.get(FAULTS_ENV, default))


def seed(default: int) -> int:
    """``default``, unless :data:`SEED_ENV` asks for another random seed (to try more runs)."""
    return int(os.environ.get(SEED_ENV, default))


@dataclass(frozen=True, slots=True)
class Store:
    """Where the agents rendezvous: ``--rdzv-backend`` and ``--rdzv-endpoint``."""

    backend: str
    endpoint: str


class Rounds:
    """Collects JOIN lines into rounds; wakes waiters on each line.

    When a completed round's number shows up again (its workers were started again), the
    line starts a new round if it comes after another
    round's line, from an agent that already reported in the completed round, or with another
    world size. Otherwise (right after its round completed, from another agent, with the same
    world size) it stays in the round, so a surplus participant is a violation.
    """

    def __init__(self) -> None:
        self.by_port: dict[str, list[dict[str, str]]] = {}
        self.changed = anyio.Event()
        self.latest = ""
        """The round completed last."""
        self._last = ""

    def add(self, record: dict[str, str]) -> str:
        """File one worker's line; return its round's key."""
        round_ = record["AIOELASTIC_ROUND"]
        key, reuse = round_, 1
        while key in self.by_port and _is_complete(self.by_port[key]):
            records = self.by_port[key]
            same_round = key == self._last and record["WORLD_SIZE"] == records[0]["WORLD_SIZE"]
            if same_round and all(r["AGENT"] != record["AGENT"] for r in records):
                break
            reuse += 1
            key = f"{round_}#{reuse}"
        self.by_port.setdefault(key, []).append(record)
        self._last = key
        if _is_complete(self.by_port[key]):
            self.latest = key
        self.changed.set()
        self.changed = anyio.Event()
        return key

    def complete(self) -> dict[str, list[dict[str, str]]]:
        return {key: records for key, records in self.by_port.items() if _is_complete(records)}


def _is_complete(records: list[dict[str, str]]) -> bool:
    return len(records) >= int(records[0]["WORLD_SIZE"])


def violations(records: list[dict[str, str]]) -> list[str]:
    """What is wrong with one completed round (empty when its ranks and sizes are right)."""
    sizes = {r["WORLD_SIZE"] for r in records} | {r["GROUP_WORLD_SIZE"] for r in records}
    ranks = sorted(int(r["RANK"]) for r in records)
    found = []
    if len(sizes) != 1:
        found.append(f"world sizes disagree: {sorted(sizes)}")
    if ranks != list(range(int(records[0]["WORLD_SIZE"]))):
        found.append(f"ranks not 0..N-1 once each: {ranks}")
    return found


@dataclass
class Outcome:
    """What a chaos run saw; :func:`report` turns it into figures and a verdict."""

    faults: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)
    hung_after: Counter[str] = field(default_factory=Counter)
    outside: Counter[str] = field(default_factory=Counter)
    stalls: list[str] = field(default_factory=list)
    exits: Counter[int] = field(default_factory=Counter)
    member_problems: list[str] = field(default_factory=list)
    member_rejoins: list[float] = field(default_factory=list)
    leader_hits: int = 0
    live_seen: Counter[int] = field(default_factory=Counter)
    duration: float = 0.0
    budget_reached: bool = False
    rounds: Rounds = field(default_factory=Rounds)


class MemberFaults:
    """Faults on the members of a 3-member etcd cluster, at most one member out at a time.

    At each step: a paused member is resumed, or a killed one restarted, with probability
    one half; with no member out, a new fault (SIGKILL or SIGSTOP) hits with probability
    ``rate``, on the leader half of the time. A restarted member counts as out until it serves
    linearizable reads again (bounded by :data:`REJOIN_BOUND`; missing it is a problem).
    """

    def __init__(self, cluster: EtcdCluster, rate: float = 0.5) -> None:
        self.cluster = cluster
        self.rate = rate
        self.down: EtcdMember | None = None
        self.paused: EtcdMember | None = None
        self.rejoined = anyio.Event()
        self.rejoined.set()

    def brief(self) -> str:
        """Which member is out, in a few words."""
        if self.paused is not None:
            return f"{self.paused.name} paused"
        if self.down is not None:
            return f"{self.down.name} {'down' if not self.down.running else 'rejoining'}"
        return "all up"

    def state(self) -> str:
        """One line per member: running, paused or down (for stall reports)."""
        lines = []
        for member in self.cluster.members:
            if member is self.paused:
                status = "paused (SIGSTOP)"
            elif not member.running:
                status = "down"
            elif member is self.down:
                status = "restarted, rejoining"
            else:
                status = "running"
            lines.append(f"etcd {member.name} {member.endpoint}: {status}")
        return "\n".join(lines)

    async def step(self, rng: random.Random, outcome: Outcome, group: anyio.abc.TaskGroup) -> None:
        """Inject or heal at most one member fault."""
        if self.paused is not None:
            if rng.random() < 0.5:
                self.paused.signal(signal.SIGCONT)
                self.paused = None
                outcome.faults["member sigcont"] += 1
            return
        if self.down is not None:
            if self.rejoined.is_set() and rng.random() < 0.5:
                self.rejoined = anyio.Event()
                self.down.start()
                outcome.faults["member restart"] += 1
                group.start_soon(self._await_rejoin, self.down, outcome)
            return
        if rng.random() >= self.rate:
            return
        victim = rng.choice(self.cluster.members)
        if rng.random() < 0.5:
            try:
                victim = await anyio.to_thread.run_sync(self.cluster.leader)
            except (RuntimeError, grpc.RpcError):
                pass  # mid-election: the random member it is
            else:
                outcome.leader_hits += 1
        if rng.random() < 0.5:
            await anyio.to_thread.run_sync(victim.kill)
            self.down = victim
            outcome.faults["member sigkill"] += 1
        else:
            victim.signal(signal.SIGSTOP)
            self.paused = victim
            outcome.faults["member sigstop"] += 1

    async def _await_rejoin(self, member: EtcdMember, outcome: Outcome) -> None:
        began = anyio.current_time()
        try:
            await anyio.to_thread.run_sync(self.cluster.wait_ready, [member], REJOIN_BOUND)
        except RuntimeError as error:
            outcome.member_problems.append(f"{member.name} did not rejoin: {error}")
        else:
            outcome.member_rejoins.append(anyio.current_time() - began)
        self.down = None
        self.rejoined.set()

    async def heal(self) -> None:
        """Resume a paused member and wait for a restarting one (before teardown)."""
        if self.paused is not None:
            self.paused.signal(signal.SIGCONT)
            self.paused = None
        await self.rejoined.wait()


class Agent:
    """One `aioelastic run` process, its log file and whether the harness stopped it."""

    def __init__(self, process: anyio.abc.Process, log: TextIO, log_path: Path) -> None:
        self.process = process
        self.log = log
        self.log_path = log_path
        self.stopped = False
        self.last_round = ""

    def tail(self, lines: int = 8) -> str:
        """The agent's last log lines (not gRPC's own, which DEBUG makes the most of)."""
        text = self.log_path.read_text(errors="replace").splitlines()
        ours = [line for line in text if not line.startswith("[grpc.")]
        return "\n".join(f"    {line}" for line in ours[-lines:])


class Chaos:
    """One chaos run: agents on ``store``, faults by ``plan``, logs under ``directory``."""

    def __init__(
        self,
        store: Store,
        plan: ChaosPlan,
        directory: Path,
        members: MemberFaults | None = None,
    ) -> None:
        self.store = store
        self.plan = plan
        self.directory = directory
        self.members = members
        self.rng = random.Random(plan.seed)
        self.outcome = Outcome()
        self.agents: list[Agent] = []
        self.started = 0
        self.began = 0.0
        self.timeline = (directory / "faults.log").open("w")
        script = directory / "worker.py"
        script.write_text(WORKER)
        nnodes = f"{plan.min_live}:{plan.max_live}"
        self.command = [sys.executable, "-m", "aioelastic", "run", "--nnodes", nnodes]
        self.command += ["--rdzv-backend", store.backend, "--rdzv-endpoint", store.endpoint]
        self.command += ["--rdzv-id", RUN_ID, "--max-restarts", "100000"]
        self.command += ["--rdzv-conf", plan.rdzv_conf, str(script)]

    def live(self) -> list[Agent]:
        return [a for a in self.agents if a.process.returncode is None and not a.stopped]

    async def run(self) -> Outcome:
        """Inject ``plan.faults`` faults (fewer if the time budget runs out); return the outcome."""
        began = self.began = anyio.current_time()
        try:
            async with anyio.create_task_group() as group:
                for _ in range(self.plan.min_live):
                    await self._start(group)
                await self._next_round(set(), "first round")
                for step in range(self.plan.faults):
                    if anyio.current_time() - began > self.plan.time_budget:
                        self.outcome.budget_reached = True
                        break
                    self._forget_exited()
                    seen = set(self.outcome.rounds.complete())
                    if self.members is not None:
                        await self.members.step(self.rng, self.outcome, group)
                    action, required = await self._agent_fault(group, step)
                    await self._next_round(seen, action, required)
                if self.members is not None:
                    await self.members.heal()
                group.cancel_scope.cancel()
        finally:
            await self._stop_all()
            self.timeline.close()
        self.outcome.duration = anyio.current_time() - began
        return self.outcome

    async def _start(self, group: anyio.abc.TaskGroup) -> None:
        self.started += 1
        log_path = self.directory / f"agent-{self.started}.log"
        log = log_path.open("w")
        process = await anyio.open_process(
            self.command,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "LOGLEVEL": LOG_LEVEL},
        )
        agent = Agent(process, log, log_path)
        self.agents.append(agent)
        group.start_soon(self._read, agent)

    async def _read(self, agent: Agent) -> None:
        assert agent.process.stdout is not None
        buffer = b""
        async for chunk in agent.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                _, found, payload = line.partition(b"JOIN ")
                if found:
                    agent.last_round = self.outcome.rounds.add(json.loads(payload))

    def _forget_exited(self) -> None:
        """Drop agents that exited by themselves (counted by exit status)."""
        for agent in [a for a in self.agents if a.process.returncode is not None]:
            self.outcome.exits[agent.process.returncode or 0] += 1
            agent.log.close()
            self.agents.remove(agent)

    def target(self, step: int) -> int:
        """The live agent count the walk leans toward at fault ``step``: a triangle wave from
        ``min_live`` up to ``max_live`` and back, twice over the run."""
        phase = (2 * step / self.plan.faults) % 1
        span = self.plan.max_live - self.plan.min_live
        return self.plan.min_live + round(span * (1 - abs(2 * phase - 1)))

    async def _agent_fault(self, group: anyio.abc.TaskGroup, step: int) -> tuple[str, bool]:
        """Inject one agent fault; return its kind and whether it requires a new round (not
        when its victim was outside the current round, say still joining)."""
        stopped = [a for a in self.agents if a.stopped]
        live = self.live()
        self.outcome.live_seen[len(live)] += 1
        lean = len(live) - self.target(step)
        if stopped:
            action = "agent sigcont"
        elif len(live) <= self.plan.min_live:
            action = "agent start"
        elif len(live) >= self.plan.max_live:
            action = self.rng.choice(["agent sigkill", "agent sigstop"])
        elif lean < 0:
            action = self.rng.choice(["agent start", "agent start", "agent sigstop"])
        elif lean > 0:
            action = self.rng.choice(["agent sigkill", "agent sigkill", "agent sigstop"])
        else:
            action = self.rng.choice(["agent sigkill", "agent sigstop", "agent start"])
        self.outcome.faults[action] += 1
        victim = self.rng.choice(live)
        required = action in ("agent sigcont", "agent start")
        if not required and victim.last_round != self.outcome.rounds.latest:
            self.outcome.outside[action] += 1
        else:
            required = True
        if action == "agent sigkill":
            victim.process.kill()
            await victim.process.wait()
            victim.log.close()
            self.agents.remove(victim)
        elif action == "agent sigstop":
            victim.process.send_signal(signal.SIGSTOP)
            victim.stopped = True
        elif action == "agent sigcont":
            stopped[0].process.send_signal(signal.SIGCONT)
            stopped[0].stopped = False
        else:
            await self._start(group)
        return action, required

    async def _next_round(self, seen: set[str], action: str, required: bool = True) -> None:
        if not required:
            self._note(f"{action} of an agent outside the current round: no new round required")
            return
        rounds = self.outcome.rounds
        began = anyio.current_time()
        with anyio.move_on_after(self.plan.hang_bound) as scope:
            while not set(rounds.complete()) - seen:
                await rounds.changed.wait()
        self.outcome.waits.append(anyio.current_time() - began)
        self._note(f"{action}: next round after {self.outcome.waits[-1]:.1f} s")
        if scope.cancelled_caught:
            self.outcome.hung_after[action] += 1
            await self._record_stall(action)

    def _note(self, text: str) -> None:
        """Add a line to ``faults.log`` (seconds since the start, live agents, what happened)."""
        moment = anyio.current_time() - self.began
        members = f" | {self.members.brief()}" if self.members is not None else ""
        self.timeline.write(f"{moment:8.1f} live={len(self.live())}{members} | {text}\n")
        self.timeline.flush()

    async def _record_stall(self, action: str) -> None:
        """Write what every agent and member was doing when no round came."""
        number = len(self.outcome.stalls) + 1
        path = self.directory / f"stall-{number}.txt"
        sections = [f"no round within {self.plan.hang_bound:g} s after: {action}"]
        if self.members is not None:
            sections.append(self.members.state())
        sections.append(await self._status())
        for agent in self.agents:
            process = agent.process
            state = "stopped" if agent.stopped else "running"
            if process.returncode is not None:
                state = f"exited {process.returncode}"
            where = f"last round {agent.last_round or 'none'}"
            sections.append(f"agent {agent.log_path.name} pid {process.pid} {state}, {where}:")
            sections.append(agent.tail())
        path.write_text("\n".join(sections) + "\n")
        self.outcome.stalls.append(f"after {action}: {path}")

    async def _status(self) -> str:
        """`aioelastic status` of the run (the rendezvous keys), or why it failed."""
        command = [sys.executable, "-m", "aioelastic", "status", "--rdzv-id", RUN_ID]
        command += ["--rdzv-backend", self.store.backend, "--rdzv-endpoint", self.store.endpoint]
        command += ["--timeout", "20"]
        with anyio.move_on_after(60):
            result = await anyio.run_process(command, check=False)
            return (result.stdout + result.stderr).decode(errors="replace")
        return "aioelastic status did not answer within 60 s"

    async def _stop_all(self) -> None:
        with anyio.CancelScope(shield=True):
            for agent in self.agents:
                if agent.process.returncode is None:
                    agent.process.send_signal(signal.SIGCONT)
                    agent.process.kill()
                    await agent.process.wait()
                await agent.process.aclose()
                agent.log.close()


def report(outcome: Outcome, plan: ChaosPlan, figures: Figures) -> None:
    """Record the figures; fail on an invariant violation, a hang or an agent that exited."""
    complete = outcome.rounds.complete()
    found = [v for records in complete.values() for v in violations(records)]
    found += outcome.member_problems
    hangs = sum(outcome.hung_after.values())
    waits = sorted(outcome.waits)
    figures["faults injected"] = dict(sorted(outcome.faults.items()))
    if outcome.leader_hits:
        figures["member faults aimed at the leader"] = outcome.leader_hits
    if outcome.member_rejoins:
        figures["slowest member rejoin (s)"] = round(max(outcome.member_rejoins), 1)
    figures["of which on agents outside the current round (no new round required)"] = dict(
        outcome.outside
    )
    figures["agents live before each fault"] = dict(sorted(outcome.live_seen.items()))
    figures["rounds completed"] = len(complete)
    figures["rounds never completed (a member died first)"] = len(outcome.rounds.by_port) - len(
        complete
    )
    figures["world sizes seen"] = dict(sorted(Counter(len(r) for r in complete.values()).items()))
    figures["agents that exited by themselves (by status)"] = dict(outcome.exits)
    figures["invariant violations"] = found
    figures[f"faults followed by no round within {plan.hang_bound:g} s"] = dict(outcome.hung_after)
    figures["stall reports"] = outcome.stalls
    figures["fault-to-next-round median / slowest (s)"] = (
        round(waits[len(waits) // 2], 1),
        round(waits[-1], 1),
    )
    figures["stopped at the time budget"] = outcome.budget_reached
    figures["duration (s)"] = round(outcome.duration)
    assert found == []
    assert not hangs, (
        f"rendezvous: {hangs} fault(s) ({dict(outcome.hung_after)}) were followed by no "
        f"completed round within {plan.hang_bound:g} s; agent states in {outcome.stalls}"
    )
    assert not outcome.exits, f"agents exited by themselves: {dict(outcome.exits)}"
