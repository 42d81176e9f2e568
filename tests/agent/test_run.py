"""``aioelastic run`` end to end: real agents, real workers, real signals."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent.conftest import (
    BOUND,
    WORKER,
    free_port,
    launched,
    on_terminal,
    pids_in,
    wait_gone,
)

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parents[2] / "examples"
WORKER_ARGS = (WORKER, "--block-unless-nodes", "3")


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The test only drives subprocesses; the launcher itself runs on uvloop when installed."""
    return request.param


async def test_demo_hung_worker_is_reaped_and_the_group_finishes() -> None:
    """The README demo: rank 2 hangs once, the watchdog reaps it, the restarted group finishes."""
    argv = ["--standalone", "--nproc-per-node", "4", "--max-restarts", "1"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, str(EXAMPLES / "agent_watchdog.py")) as run:
            status = await run.wait()
    assert status == 0, run
    assert "watchdog: timer 'step-1' of rank 2" in run.err.text
    assert "rank 2 failed: reaped by the watchdog (SIGKILL): timer 'step-1' expired" in run.err.text
    assert "restarting the worker group (1/1)" in run.err.text
    assert "run succeeded" in run.err.text
    assert run.out.text.count("step 2 done (attempt 1)") == 4


async def test_restarts_exhausted_exits_nonzero_with_the_failure_report() -> None:
    """A worker failing every attempt ends the job with status 1 and its traceback reported."""
    argv = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--fail-rank", "1", "--fail-attempts", "9") as run:
            status = await run.wait()
    assert status == 1, run
    report = run.err.text[run.err.text.index("scenario.py FAILED") :]
    assert "root cause (first failure): rank 1 (local rank 1)" in report
    assert "error     : RuntimeError: rank 1 fails on attempt 1" in report
    assert "Traceback (most recent call last)" in report
    assert "run failed: restarts exhausted (1 allowed)" in run.err.text


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_signal_stops_everything_with_conventional_status(signum: signal.Signals) -> None:
    """A signal to the agent is forwarded; it exits 128+signal and leaves no process behind."""
    argv = ["--standalone", "--nproc-per-node", "2"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--grandchild") as run:
            await run.out.wait_for("pids", count=2)
            run.send_signal(signum)
            status = await run.wait()
        pids = pids_in(run.out.text)
        for pid in pids:
            await wait_gone(pid)
    assert len(pids) == 4
    assert status == 128 + signum, run
    assert f"received {signum.name}: stopping the workers" in run.err.text


async def test_signal_while_waiting_for_other_nodes_exits_cleanly() -> None:
    """A node still waiting for the others to join stops at once on SIGINT, status 130."""
    argv = c10d_argv(free_port(), "2:2")
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER) as run:
            await run.err.wait_for("joining rendezvous 'elastic-test' (c10d)")
            run.send_signal(signal.SIGINT)
            status = await run.wait()
    assert status == 128 + signal.SIGINT, run
    assert "run stopped: stopped by SIGINT" in run.err.text


async def test_module_mode_runs_a_module_with_python_m() -> None:
    """-m runs the training program as a module, as torchrun does."""
    argv = ["--standalone", "--nproc-per-node", "2", "-m", "tests.agent.workers.scenario"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, cwd=EXAMPLES.parent) as run:
            status = await run.wait()
    assert status == 0, run
    assert "done rank=1 attempt=0 nodes=1" in run.out.text


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["--rdzv-backend", "nosuch"], "nosuch"),
        (["--standalone", "--rdzv-conf", "join_timeout=-1"], "join_timeout"),
        (["--standalone", "--role="], "role"),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", ":29400"], "':29400' has no host"),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1"], "'[::1' is malformed"),
        (["--standalone", "--nnodes", "2"], "--standalone runs a single node"),
        (["--standalone", "--no-python", "no-such-program"], "'no-such-program' is not on PATH"),
    ],
    ids=["backend", "conf", "role", "empty-host", "open-bracket", "standalone-nnodes", "no-python"],
)
async def test_bad_settings_fail_at_once_naming_them(argv: list[str], name: str) -> None:
    """Settings refused by the rendezvous or the spec: one line, exit status 2, no worker."""
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER) as run:
            status = await run.wait()
    assert status == 2, run
    assert run.err.text.count("\n") == 1, run
    assert name in run.err.text
    assert run.out.text == ""


async def test_static_rendezvous_across_two_agents() -> None:
    """Two agents with the static backend (node ranks 0 and 1) run one 4-worker job."""
    port = free_port()

    def argv(node_rank: int) -> list[str]:
        return [
            "--nnodes=2",
            "--nproc-per-node=2",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            WORKER,
        ]

    with anyio.fail_after(BOUND):
        async with launched(*argv(0)) as first, launched(*argv(1)) as second:
            statuses = [await first.wait(), await second.wait()]
    assert statuses == [0, 0], (first, second)
    assert "done rank=1 attempt=0 nodes=2" in first.out.text
    assert "done rank=3 attempt=0 nodes=2" in second.out.text


def c10d_argv(port: int, nnodes: str, *extra: str) -> list[str]:
    return [
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "elastic-test",
        "--rdzv-conf",
        "last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5,close_timeout=2",
        *extra,
    ]


async def test_a_third_agent_joining_restarts_everyone_with_the_larger_world() -> None:
    """Scale-up: agents 1 and 2 run a 2-node job; a third joins; all rerun with 3 nodes."""
    argv = [*c10d_argv(free_port(), "2:3"), WORKER, "--block-unless-nodes", "3"]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as first, launched(*argv) as second:
            await first.err.wait_for(" of 2, world size 2")
            await second.err.wait_for(" of 2, world size 2")
            async with launched(*argv) as third:
                statuses = [await first.wait(), await second.wait(), await third.wait()]
    assert statuses == [0, 0, 0], (first, second, third)
    for agent in (first, second):
        assert "membership changed (nodes_waiting)" in agent.err.text
        assert "restarting" not in agent.err.text
    assert "done rank=2 attempt=0 nodes=3" in first.out.text + second.out.text + third.out.text


async def test_survivors_re_rendezvous_when_an_agent_is_killed(tmp_path: Path) -> None:
    """Node loss: one of three agents is SIGKILLed; the other two continue as a 2-node job.

    The store is served by its own process, as in a deployment where no agent hosts it: an
    agent hosting the store takes the job down with it when it dies.
    """
    release = tmp_path / "released"
    port = free_port()
    argv = [
        *c10d_argv(port, "2:3"),
        WORKER,
        "--block-unless-nodes",
        "2",
        "--release-file",
        str(release),
    ]
    with anyio.fail_after(BOUND):
        async with launched("--port", str(port), command="store-server") as store:
            await store.out.wait_for("listening")
            async with launched(*argv) as a, launched(*argv) as b, launched(*argv) as c:
                for agent in (a, b, c):
                    await agent.err.wait_for("of 3, world size 3")
                    await agent.out.wait_for("pids")
                release.touch()
                c.send_signal(signal.SIGKILL)
                statuses = [await a.wait(), await b.wait()]
        for pid in pids_in(c.out.text):
            await wait_gone(pid)  # the killed agent's worker died with it
    assert statuses == [0, 0], (a, b)
    for agent in (a, b):
        assert "membership changed (participant_lost)" in agent.err.text
        assert "nodes=2" in agent.out.text


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_torch_gloo_all_reduce_across_four_workers() -> None:
    """Four torch workers started by aioelastic run form a gloo group and all_reduce."""
    argv = ["--standalone", "--nproc-per-node", "4"]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv, str(EXAMPLES / "agent_torch_allreduce.py")) as run:
            status = await run.wait()
    assert status == 0, run
    for rank in range(4):
        assert f"rank {rank}/4 (local {rank}): sum 10" in run.out.text


async def test_tee_relays_a_partial_line_at_once() -> None:
    """With -t, a prompt without a newline shows (prefixed) before the worker gets its answer."""
    argv = ["--standalone", "--nproc-per-node", "1", "-t", "1"]
    with anyio.fail_after(BOUND):
        async with on_terminal(*argv, str(EXAMPLES / "agent_terminal.py")) as (process, terminal):
            await terminal.screen.wait_for("[0]: continue? ")
            terminal.type("yes\n")
            status = await process.wait()
        await terminal.screen.wait_closed()
    assert status == 0, terminal.screen.text
    assert "rank 0: stdin=True stdout=False stderr=True" in terminal.screen.text
    assert "\r[0]: progress  50%\r[0]: progress 100%" in terminal.screen.text
    assert "[0]: continue? yes\r\nanswered 'yes'" in terminal.screen.text  # the echo ends the line


async def test_redirects_without_a_log_dir_go_to_a_temporary_directory_named_on_the_console() -> (
    None
):
    """-r without --log-dir: the output lands in a new temporary directory the agent names."""
    argv = ["--standalone", "--nproc-per-node", "2", "-r", "1", WORKER]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 0, run
    found = re.search(
        r"worker logs in (\S+) \(a temporary directory, no --log-dir given\)", run.err.text
    )
    assert found, run
    run_dir = Path(found[1])
    try:
        assert run.out.text == ""
        for rank in range(2):
            log = run_dir / "attempt_0" / str(rank) / "stdout.log"
            assert f"done rank={rank} attempt=0" in log.read_text()
    finally:
        shutil.rmtree(run_dir.parent)


HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize(
    ("argv", "with_torch", "without_torch"),
    [
        (
            ["--numa-binding", "node"],
            "--numa-binding node binds each worker to the CPUs near its GPU",
            "--numa-binding node needs torch installed",
        ),
        (
            ["--logs-specs", "nosuch"],
            "--logs-specs 'nosuch': no entry point of that name",
            "--logs-specs 'nosuch' names a torch LogsSpecs class: install torch",
        ),
        (
            ["--event-log-handler", "scuba"],
            "expected one of null, console, dynamic_rendezvous",
            "expected one of null, console, dynamic_rendezvous",
        ),
    ],
    ids=["numa-without-gpu", "unknown-logs-specs", "unknown-event-handler"],
)
async def test_torch_2_13_flags_that_cannot_apply_fail_in_one_line(
    argv: list[str], with_torch: str, without_torch: str
) -> None:
    """A torch 2.13 flag that cannot apply here is refused in one line naming it (status 2),
    with or without torch installed (without it, the line says to install torch)."""
    if argv[0] == "--numa-binding" and torch_has_cuda():
        pytest.skip("this machine has CUDA devices")
    expected = with_torch if HAS_TORCH else without_torch
    with anyio.fail_after(BOUND):
        async with launched("--standalone", *argv, WORKER) as run:
            status = await run.wait()
    assert status == 2, run
    assert run.err.text.count("\n") == 1, run
    assert expected in run.err.text


def torch_has_cuda() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


async def test_event_log_handler_console_prints_every_event_as_json() -> None:
    """--event-log-handler console: the agent's events appear as JSON lines on stderr."""
    argv = ["--standalone", "--nproc-per-node", "2", "--event-log-handler", "console", WORKER]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 0, run
    kinds = [json.loads(line)["kind"] for line in run.err.text.splitlines() if line.startswith("{")]
    assert kinds.count("WorkerSucceeded") == 2
    assert "RunFinished" in kinds


async def test_an_unknown_pet_variable_warns_and_a_known_one_applies(tmp_path: Path) -> None:
    """PET_<FLAG> sets a flag (here --virtual-local-rank); a PET_* naming no flag, or one that
    changes nothing here, is warned about."""
    env = {"PET_VIRTUAL_LOCAL_RANK": "1", "PET_NPROC_PER_NODES": "2", "PET_START_METHOD": "fork"}
    argv = ["--standalone", WORKER, "--out", str(tmp_path)]
    with anyio.fail_after(BOUND):
        async with launched(*argv, env=env) as run:
            status = await run.wait()
    assert status == 0, run
    assert (
        "warning: PET_NPROC_PER_NODES is ignored: --nproc-per-nodes is not a flag" in run.err.text
    )
    assert "warning: PET_START_METHOD has no effect: workers are always started" in run.err.text
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]  # noqa: ASYNC240
    assert record["CUDA_VISIBLE_DEVICES"] == "0"


async def test_an_unreachable_etcd_fails_at_once_in_one_line() -> None:
    """No etcd listening at the endpoint: one line naming it and why, status 1, no wait."""
    port = free_port()
    argv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", f"127.0.0.1:{port}", WORKER]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 1, run
    assert run.err.text.count("\n") == 1, run
    assert f"no etcd member is reachable (127.0.0.1:{port}: Connection refused)" in run.err.text


async def test_the_others_stop_at_once_when_the_store_host_is_killed() -> None:
    """The agent hosting the c10d store is SIGKILLed: the other ends its run at once, saying
    the store's host was lost (not fenced after the heartbeat timeout)."""
    port = free_port()
    conf = "last_call_timeout=0.5,heartbeat_timeout=30,keep_alive_interval=10,close_timeout=2"

    def argv(is_host: str) -> list[str]:
        base = c10d_argv(port, "2")
        return [*base[: base.index("--rdzv-conf") + 1], f"{conf},is_host={is_host}", *WORKER_ARGS]

    with anyio.fail_after(BOUND):
        async with launched(*argv("true")) as host, launched(*argv("false")) as other:
            for agent in (host, other):
                await agent.out.wait_for("pids")
            host.send_signal(signal.SIGKILL)
            status = await other.wait()
        for pid in pids_in(other.out.text):
            await wait_gone(pid)
    assert status == 1, other
    assert "the store's host was lost" in other.err.text
    assert "fenced" not in other.err.text
