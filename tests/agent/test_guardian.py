"""The guardian: worker groups of an agent that died are stopped; nothing else ever is."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent._guardian import PROGRAM, Guardian
from aioelastic.agent._guardian_main import (
    BYE,
    MAX_PGID,
    SPAWNING,
    TOKEN_VARIABLE,
    Registry,
    register_line,
    unregister_line,
)
from tests.agent.conftest import (
    BOUND,
    WORKER,
    guardian_of,
    launched,
    pids_in,
    read_line,
    reaped,
    wait_gone,
)

pytestmark = pytest.mark.anyio

# -- the registry (pure) ---------------------------------------------------------------------

PGIDS = st.integers(2, 6)
OPS = st.lists(st.tuples(st.sampled_from("+-"), PGIDS), max_size=30)
VALID = re.compile(rb"[+-][0-9]+|bye|\*")
GARBAGE = st.binary(max_size=12).filter(lambda b: b"\n" not in b and not VALID.fullmatch(b))


def encode(ops: list[tuple[str, int]]) -> list[bytes]:
    return [register_line(g) if op == "+" else unregister_line(g) for op, g in ops]


def model(ops: list[tuple[str, int]]) -> set[int]:
    """What the registry must hold: each group's last message decides."""
    groups: set[int] = set()
    for op, pgid in ops:
        (groups.add if op == "+" else groups.discard)(pgid)
    return groups


def feed_in_chunks(registry: Registry, data: bytes, cuts: list[int]) -> None:
    for start, end in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)], strict=True):
        registry.feed(data[start:end])


@given(OPS, st.lists(st.integers(0, 400)))
def test_registry_holds_registered_minus_unregistered_however_the_bytes_arrive(
    ops: list[tuple[str, int]], cuts: list[int]
) -> None:
    """Whatever the chunking, the groups to signal are those whose last message was '+'."""
    registry = Registry()
    data = b"".join(encode(ops))
    feed_in_chunks(registry, data, [c for c in cuts if c <= len(data)])
    assert registry.to_signal() == model(ops)
    assert registry.rejected == 0


@given(OPS, st.lists(GARBAGE, max_size=10), st.randoms())
def test_malformed_lines_are_counted_and_change_nothing(
    ops: list[tuple[str, int]], garbage: list[bytes], rng: Any
) -> None:
    """Malformed lines between real messages are rejected; only registered groups remain."""
    lines = encode(ops)
    for junk in garbage:
        lines.insert(rng.randint(0, len(lines)), junk + b"\n")
    registry = Registry()
    registry.feed(b"".join(lines))
    assert (registry.to_signal(), registry.rejected) == (model(ops), len(garbage))


@given(OPS, OPS)
def test_after_bye_nothing_is_signalled_and_later_lines_are_ignored(
    before: list[tuple[str, int]], after: list[tuple[str, int]]
) -> None:
    """A clean goodbye means no group is signalled, whatever came before or after it."""
    registry = Registry()
    registry.feed(b"".join([*encode(before), BYE, *encode(after)]))
    assert registry.said_bye
    assert registry.to_signal() == frozenset()
    assert registry.groups == model(before)


def test_a_worker_being_started_is_pending_until_its_group_is_registered() -> None:
    """'*' announces a start; the next registration settles it (so the guardian knows to look)."""
    registry = Registry()
    registry.feed(SPAWNING + SPAWNING + register_line(7))
    assert (registry.spawning, registry.to_signal()) == (1, {7})


@pytest.mark.parametrize(
    "line", [b"+0", b"+1", b"-1", b"+-5", b"+ 5", b"+5.0", b"+%d" % (MAX_PGID + 1), b"BYE", b"+"]
)
def test_ids_that_are_not_a_workers_group_are_rejected(line: bytes) -> None:
    """Group 0 (the guardian's own), init's, negative, odd and oversized ids are refused."""
    registry = Registry()
    registry.feed(line + b"\n")
    assert (registry.to_signal(), registry.rejected) == (frozenset(), 1)


# -- the guardian program, driven directly ---------------------------------------------------

TOKEN = "test-token"
LEADER = """
import signal, subprocess, sys, time
if sys.argv[1:] == ["ignore-sigterm"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


@dataclass
class Group:
    """A process group like a worker's: a leader in its own session and one grandchild."""

    leader: subprocess.Popen[bytes]
    grandchild: int

    @property
    def pgid(self) -> int:
        return self.leader.pid

    def alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return self.leader.poll() is None

    async def wait(self) -> int:
        """The leader's exit status, once the grandchild has exited too."""
        await wait_gone(self.leader.pid)
        await wait_gone(self.grandchild)
        return self.leader.wait()


def start_leader(flag: str, stdout: int) -> subprocess.Popen[bytes]:
    """``flag``: '', 'ignore-sigterm', or 'token' (the guardian's token in its environment)."""
    env = {**os.environ, TOKEN_VARIABLE: TOKEN} if flag == "token" else None
    argv = [sys.executable, "-c", LEADER, *([flag] if flag else [])]
    return subprocess.Popen(argv, stdout=stdout, start_new_session=True, env=env)


@contextlib.asynccontextmanager
async def groups(*flags: str) -> AsyncIterator[list[Group]]:
    """Start one group per flag ('' or 'ignore-sigterm'); SIGKILL and reap them afterwards."""
    started: list[Group] = []
    try:
        for flag in flags:
            read_fd, write_fd = os.pipe()
            leader = start_leader(flag, write_fd)
            os.close(write_fd)
            try:
                with anyio.fail_after(BOUND):
                    grandchild = int(await read_line(read_fd))
            finally:
                os.close(read_fd)
            started.append(Group(leader, grandchild))
        yield started
    finally:
        for group in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group.pgid, signal.SIGKILL)
            group.leader.wait()


@contextlib.contextmanager
def guardian_program(grace: float) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The guardian program and the write end of its pipe (the agent's side)."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", PROGRAM, repr(grace), TOKEN],
        stdin=read_end,
        start_new_session=True,
    )
    os.close(read_end)
    try:
        yield process, write_end
    finally:
        with contextlib.suppress(OSError):
            os.close(write_end)
        process.kill()
        process.wait()


async def test_dead_agent_groups_get_sigterm_then_sigkill_and_unregistered_are_spared() -> None:
    """Pipe ends without bye: SIGTERM, SIGKILL after the grace; an unregistered group is spared."""
    async with groups("", "ignore-sigterm", "") as (polite, stubborn, spared):
        with guardian_program(grace=0.2) as (guardian, pipe):
            messages = [register_line(g.pgid) for g in (polite, stubborn, spared)]
            os.write(pipe, b"".join([*messages, unregister_line(spared.pgid)]))
            os.close(pipe)  # the agent died: end of file, no bye
            with anyio.fail_after(BOUND):
                await wait_gone(guardian.pid)
                assert await polite.wait() == -signal.SIGTERM
                assert await stubborn.wait() == -signal.SIGKILL
            assert guardian.wait() == 0
        assert spared.alive()
        os.kill(spared.grandchild, 0)  # still there: raises ProcessLookupError otherwise


async def test_a_worker_the_agent_died_starting_is_found_by_its_token() -> None:
    """Announced but never registered (agent killed mid-start): its token carriers are stopped."""
    async with groups("token", "") as (orphan, stranger):
        with guardian_program(grace=0.2) as (guardian, pipe):
            os.write(pipe, SPAWNING)
            os.close(pipe)
            with anyio.fail_after(BOUND):
                await wait_gone(guardian.pid)
                assert await orphan.wait() == -signal.SIGTERM
        assert stranger.alive()  # no token, never registered: not the guardian's


async def test_after_bye_the_guardian_exits_and_signals_nothing() -> None:
    """A clean goodbye: the guardian exits at once and the registered group keeps running."""
    async with groups("") as (group,):
        with guardian_program(grace=0.2) as (guardian, pipe):
            os.write(pipe, register_line(group.pgid) + BYE)
            with anyio.fail_after(BOUND):
                await wait_gone(guardian.pid)  # the pipe is still open: bye alone ended it
            assert guardian.wait() == 0
        assert group.alive()


# -- the agent's side ------------------------------------------------------------------------


def fd_targets(pid: int) -> dict[int, str]:
    return {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)}


async def test_guardian_leads_its_own_session_reads_a_pipe_and_holds_no_output() -> None:
    """Ctrl-C to the agent's group cannot reach it; it never keeps the agent's output open."""
    async with Guardian(grace=1.0) as guardian:
        assert guardian.active
        pid = guardian.pid
        assert pid is not None
        assert os.getsid(pid) == pid
        targets = fd_targets(pid)
    assert targets[0].startswith("pipe:")
    assert (targets[1], targets[2]) == ("/dev/null", "/dev/null")
    assert reaped(pid)  # by aclose(): no zombie left


async def test_aclose_from_another_task_says_bye_and_reaps_the_guardian() -> None:
    """aclose() from a task other than the one that started the guardian ends and reaps it;
    leaving the block afterwards has nothing left to do."""
    async with Guardian(grace=1.0) as guardian:
        pid = guardian.pid
        assert pid is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(guardian.aclose)
        assert not guardian.active
        assert reaped(pid)


async def test_a_guardian_that_cannot_start_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No interpreter to run it: a warning says what is unprotected; registering is a no-op."""
    monkeypatch.setattr(sys, "executable", "/no/such/python")
    caplog.set_level(logging.WARNING)
    async with Guardian(grace=1.0) as guardian:
        guardian.register(12345)
        guardian.unregister(12345)
    assert (guardian.active, guardian.pid) == (False, None)
    assert "could not start the agent's guardian" in caplog.text
    assert "will outlive an agent killed with SIGKILL" in caplog.text


async def test_a_guardian_that_died_is_reported_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The guardian killed under the agent: the next message warns and the agent carries on."""
    caplog.set_level(logging.WARNING)
    async with Guardian(grace=1.0) as guardian:
        pid = guardian.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(BOUND):
            await wait_gone(pid)
        guardian.register(12345)
        assert not guardian.active
    assert f"the agent's guardian (pid {pid}) stopped reading" in caplog.text
    assert reaped(pid)


# -- end to end: aioelastic run --------------------------------------------------------------


# These only drive subprocesses; the launcher itself runs on uvloop when installed.
ONE_LOOP = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@ONE_LOOP
async def test_sigkill_of_the_agent_leaves_no_worker_grandchild_or_guardian() -> None:
    """kill -9 of aioelastic run: workers (parent-death signal) and grandchildren (guardian) go."""
    argv = ["--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "2"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--grandchild") as run:
            await run.out.wait_for("pids", count=2)
            guardian = guardian_of(run.process.pid)
            run.send_signal(signal.SIGKILL)
            assert await run.wait() == -signal.SIGKILL
        pids = pids_in(run.out.text)
        for pid in [*pids, guardian]:
            await wait_gone(pid)
    assert len(pids) == 4


@ONE_LOOP
async def test_a_run_that_ends_leaves_no_guardian() -> None:
    """A run stopped cleanly says goodbye: its guardian has exited when the agent exits."""
    argv = ["--standalone", "--nproc-per-node", "1"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--grandchild") as run:
            await run.out.wait_for("pids")
            pidfd = os.pidfd_open(guardian_of(run.process.pid))
            run.send_signal(signal.SIGTERM)
            assert await run.wait() == 128 + signal.SIGTERM, run
    try:
        assert select.select([pidfd], [], [], 0)[0] == [pidfd]  # exited already, no wait
    finally:
        os.close(pidfd)
    assert "guardian" not in run.err.text
