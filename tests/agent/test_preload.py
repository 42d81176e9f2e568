"""``aioelastic run --preload``: workers forked from a per-node template, end to end.

Real agents, a real template, real workers: each forked worker must look and behave like one
started with ``python script.py`` (argv, ``__main__``, ``sys.path``, its own session, signals,
the console, log files, the error file, the guardian), draw its own random streams, and
inherit no socket; what cannot be preloaded fails the launch with what to do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelastic.agent._events import AgentEvent, TemplateLost, TemplateReady
from aioelastic.agent._process import WorkerProcess
from aioelastic.agent._template import PreloadError, Template
from aioelastic.agent._template_command import python_command
from tests.agent.conftest import BOUND, WORKER, launched, on_terminal, pids_in, wait_gone
from tests.agent.test_guardian import guardian_of

pytestmark = pytest.mark.anyio

WORKERS = Path(__file__).parent / "workers"
PROBE = str(WORKERS / "preload_probe.py")
EXAMPLES = Path(__file__).parents[2] / "examples"
STANDALONE = ("--standalone", "--nproc-per-node")


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """These only drive subprocesses; the launcher itself runs on uvloop when installed."""
    return request.param


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def probes(text: str) -> list[dict[str, Any]]:
    """The probe worker's reports, in rank order."""
    found = [
        json.loads(line.partition("probe ")[2]) for line in text.splitlines() if "probe {" in line
    ]
    return sorted(found, key=lambda report: report["rank"])


def template_pids(text: str) -> list[int]:
    """The pid of each template the console announced."""
    return [int(pid) for pid in re.findall(r"fork template ready: pid (\d+)", text)]


# -- a forked worker is a python script's process ----------------------------------------------


async def test_workers_are_forks_of_the_template_run_as_python_script() -> None:
    """Each worker is the template's child, in its own session, with the script's argv,
    ``__main__``, ``sys.path[0]`` and the preloaded module already imported."""
    argv = [*STANDALONE, "3", "--preload", "preload_marker,fractions", PROBE, "--lr", "1"]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 0, run
    (template,) = template_pids(run.err.text)
    reports = probes(run.out.text)
    assert [r["rank"] for r in reports] == [0, 1, 2]
    for report in reports:
        assert report["ppid"] == template
        assert report["sid"] == report["pgid"] == report["pid"]
        assert report["argv"] == [PROBE, "--lr", "1"]
        assert report["orig_argv"][-3:] == [PROBE, "--lr", "1"]
        assert "-u" in report["orig_argv"]
        assert report["path0"] == str(WORKERS)
        assert report["main"] == "__main__"
        assert report["file"] == PROBE
        assert report["preloaded"] == ["fractions", "preload_marker"]


async def test_plain_workers_have_no_template_and_preload_nothing() -> None:
    """The same probe without --preload: started by the agent, nothing preloaded (the
    reference the forked workers are compared with)."""
    with anyio.fail_after(BOUND):
        async with launched(*STANDALONE, "2", PROBE) as run:
            status = await run.wait()
    assert status == 0, run
    assert template_pids(run.err.text) == []
    for report in probes(run.out.text):
        assert report["ppid"] == run.process.pid
        assert report["preloaded"] == []


async def test_forked_siblings_draw_different_random_streams() -> None:
    """random (and NumPy, torch when preloaded) are reseeded per rank in each child."""
    preload = "random,numpy" if _importable("numpy") else "random"
    with anyio.fail_after(BOUND):
        async with launched(*STANDALONE, "3", "--preload", preload, PROBE) as run:
            status = await run.wait()
    assert status == 0, run
    reports = probes(run.out.text)
    assert len({r["random"] for r in reports}) == 3
    if _importable("numpy"):
        assert len({r["numpy"] for r in reports}) == 3


async def test_a_job_seed_makes_the_streams_reproducible() -> None:
    """AIOELASTIC_SEED fixes what every child's streams derive from: two runs draw the same."""
    draws = []
    for _ in range(2):
        with anyio.fail_after(BOUND):
            async with launched(
                *STANDALONE, "2", "--preload", "random", PROBE, env={"AIOELASTIC_SEED": "7"}
            ) as run:
                assert await run.wait() == 0, run
        draws.append([r["random"] for r in probes(run.out.text)])
    assert draws[0] == draws[1]
    assert draws[0][0] != draws[0][1]


async def test_a_seed_set_by_a_preloaded_module_is_kept() -> None:
    """A preloaded module that seeded random: every child keeps that seed (same draws)."""
    argv = [*STANDALONE, "2", "--preload", "preload_seeds", PROBE]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            assert await run.wait() == 0, run
    first, second = (r["random"] for r in probes(run.out.text))
    assert first == second


@pytest.mark.torch
@pytest.mark.skipif(not _importable("torch"), reason="torch is not installed")
@pytest.mark.parametrize(("preload", "same"), [("torch", False), ("preload_torch_seed", True)])
async def test_torch_streams_differ_unless_a_preloaded_module_seeded_torch(
    preload: str, same: bool
) -> None:
    """Preloaded torch: each rank draws its own torch stream; a preloaded module that called
    torch.manual_seed keeps that seed in every worker."""
    with anyio.fail_after(BOUND * 2):
        async with launched(*STANDALONE, "2", "--preload", preload, PROBE) as run:
            assert await run.wait() == 0, run
    first, second = (r["torch"] for r in probes(run.out.text))
    assert (first == second) is same


async def test_a_forked_worker_inherits_no_socket() -> None:
    """No listening socket or store connection of the agent or template reaches a child: its
    one socket is the step-marks channel the agent gave it (``AIOELASTIC_STEPS_FD``)."""
    with anyio.fail_after(BOUND):
        async with launched(*STANDALONE, "2", "--preload", "preload_marker", PROBE) as run:
            assert await run.wait() == 0, run
    for report in probes(run.out.text):
        sockets = {fd: link for fd, link in report["fds"].items() if link.startswith("socket:")}
        assert report["steps_fd"] is not None
        assert set(sockets) == {report["steps_fd"]}, report["fds"]


async def test_no_fork_deprecation_warning() -> None:
    """The template forks single-threaded, so Python 3.12+ has no fork DeprecationWarning to
    give (an error here). With NumPy preloaded this also shows that OpenBLAS's idle threads
    are stopped before each fork: otherwise the thread check would fail the launch."""
    env = {"PYTHONWARNINGS": "error::DeprecationWarning"}
    preload = "numpy" if _importable("numpy") else "preload_marker"
    with anyio.fail_after(BOUND):
        async with launched(*STANDALONE, "2", "--preload", preload, PROBE, env=env) as run:
            assert await run.wait() == 0, run
    assert "DeprecationWarning" not in run.err.text
    assert len(probes(run.out.text)) == 2


# -- the same behaviour as plain starts --------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_stops_forked_workers_and_their_grandchildren(
    signum: signal.Signals,
) -> None:
    """A signal to the agent reaches each forked worker's group: 128+signal, nothing left."""
    argv = [*STANDALONE, "2", "--preload", "argparse,json", WORKER, "--grandchild"]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            await run.out.wait_for("pids", count=2)
            run.send_signal(signum)
            status = await run.wait()
        pids = pids_in(run.out.text)
        for pid in [*pids, *template_pids(run.err.text)]:
            await wait_gone(pid)
    assert len(pids) == 4
    assert status == 128 + signum, run


async def test_the_watchdog_reaps_a_hung_forked_worker_after_capturing_its_stacks() -> None:
    """The README demo forked: rank 2 hangs, its stacks are captured, the watchdog reaps it,
    the restarted group (forked again) finishes."""
    argv = [*STANDALONE, "4", "--max-restarts", "1", "--preload", "json"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, str(EXAMPLES / "agent_watchdog.py")) as run:
            status = await run.wait()
    assert status == 0, run
    assert "stacks before the reap: rank 2 stuck in agent_watchdog.py" in run.err.text
    assert "rank 2 failed: reaped by the watchdog (SIGKILL): timer 'step-1' expired" in run.err.text
    assert run.out.text.count("step 2 done (attempt 1)") == 4
    assert len(template_pids(run.err.text)) == 1


async def test_the_failure_report_and_error_file_of_a_forked_worker() -> None:
    """A forked worker's exception is in the report with its traceback, which starts in the
    script (as python's would), and the restarted group is forked too."""
    argv = [*STANDALONE, "2", "--max-restarts", "1", "--preload", "argparse,json"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--fail-rank", "1", "--fail-attempts", "9") as run:
            status = await run.wait()
    assert status == 1, run
    report = run.err.text[run.err.text.index("scenario.py FAILED") :]
    assert "root cause (first failure): rank 1 (local rank 1)" in report
    assert "error     : RuntimeError: rank 1 fails on attempt 1" in report
    assert "Traceback (most recent call last)" in report
    assert "_template_main" not in report
    assert "runpy" not in report


async def test_an_uncaught_exception_prints_the_scripts_traceback_and_exits_1(
    tmp_path: Path,
) -> None:
    """Without @record: python's traceback on stderr, from the script's frame; status 1."""
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\nf()\n")
    with anyio.fail_after(BOUND):
        async with launched(
            *STANDALONE, "1", "--max-restarts", "0", "--preload", "json", str(script)
        ) as run:
            assert await run.wait() == 1, run
    assert f'File "{script}", line 3, in <module>' in run.err.text
    assert "ValueError: boom" in run.err.text
    assert "runpy" not in run.err.text
    assert "ended     : exit code 1" in run.err.text


async def test_sys_exit_atexit_and_non_daemon_threads_end_as_in_python(tmp_path: Path) -> None:
    """sys.exit(3) gives status 3 after non-daemon threads finished and atexit ran once."""
    script = tmp_path / "ends.py"
    script.write_text(
        "import atexit, sys, threading\n"
        "atexit.register(lambda: sys.stdout.write('atexit ran\\n'))\n"
        "done = threading.Event()\n"
        "t = threading.Thread(target=lambda: (done.wait(), sys.stdout.write('thread ended\\n')))\n"
        "t.start()\n"
        "done.set()\n"
        "sys.exit(3)\n"
    )
    argv = [*STANDALONE, "1", "--max-restarts", "0", "--preload", "json", str(script)]
    with anyio.fail_after(BOUND):
        async with launched(*argv) as run:
            assert await run.wait() == 1, run
    assert run.out.text.count("atexit ran") == 1
    assert "thread ended" in run.out.text
    assert "ended     : exit code 3" in run.err.text


async def test_redirects_and_tee_write_a_forked_workers_log_files(tmp_path: Path) -> None:
    """-r 1 -t 2 --log-dir: stdout to its file only, stderr to its file and the console."""
    script = tmp_path / "talk.py"
    script.write_text(
        "import os, sys\nr = os.environ['RANK']\n"
        "print('out', r)\nprint('err', r, file=sys.stderr)\n"
    )
    argv = [*STANDALONE, "2", "--log-dir", str(tmp_path / "logs"), "-r", "1", "-t", "2"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, "--preload", "json", str(script)) as run:
            assert await run.wait() == 0, run
    assert "out 0" not in run.out.text
    assert "[1]: err 1" in run.err.text
    (attempt_dir,) = (tmp_path / "logs").glob("*/attempt_0")
    for rank in range(2):
        rank_dir = attempt_dir / str(rank)
        assert (rank_dir / "stdout.log").read_text() == f"out {rank}\n"
        assert (rank_dir / "stderr.log").read_text() == f"err {rank}\n"


async def test_a_forked_worker_keeps_the_terminal_rules() -> None:
    """On a terminal: the worker's stdin and stderr are the terminal, -t 1 relays stdout with
    a prefix and a partial line at once, input() works (as without --preload)."""
    argv = [*STANDALONE, "1", "-t", "1", "--preload", "json"]
    with anyio.fail_after(BOUND):
        async with on_terminal(*argv, str(EXAMPLES / "agent_terminal.py")) as (process, terminal):
            await terminal.screen.wait_for("[0]: continue? ")
            terminal.type("yes\n")
            status = await process.wait()
        await terminal.screen.wait_closed()
    assert status == 0, terminal.screen.text
    assert "rank 0: stdin=True stdout=False stderr=True" in terminal.screen.text
    assert "[0]: continue? yes\r\nanswered 'yes'" in terminal.screen.text


async def test_sigkill_of_the_agent_leaves_no_template_worker_or_grandchild() -> None:
    """kill -9 of the agent: the template dies with it, the workers with the template, the
    grandchildren by the guardian."""
    argv = [*STANDALONE, "2", "--shutdown-timeout", "2", "--preload", "argparse,json"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, WORKER, "--grandchild") as run:
            await run.out.wait_for("pids", count=2)
            guardian = guardian_of(run.process.pid)
            run.send_signal(signal.SIGKILL)
            assert await run.wait() == -signal.SIGKILL
        pids = pids_in(run.out.text)
        for pid in [*pids, guardian, *template_pids(run.err.text)]:
            await wait_gone(pid)
    assert len(pids) == 4


# -- what cannot be preloaded ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("preload_thread", "Python threads 'metrics-flusher'"),
        ("preload_fake_cuda", "CUDA is initialised in the template"),
        ("no_such_module_x", "preloading 'no_such_module_x' failed: ModuleNotFoundError"),
    ],
    ids=["thread", "cuda", "missing"],
)
async def test_a_module_that_cannot_be_preloaded_fails_the_launch(
    module: str, expected: str
) -> None:
    """The launch fails (status 1) saying why and what to do; no worker ever starts."""
    with anyio.fail_after(BOUND):
        async with launched(*STANDALONE, "2", "--preload", f"json,{module}", PROBE) as run:
            status = await run.wait()
    assert status == 1, run
    assert f"--preload json,{module}: " in run.err.text
    assert expected in run.err.text
    assert "started 2 workers" not in run.err.text
    assert probes(run.out.text) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--no-python", "--preload", "json"], "cannot be combined with --no-python"),
        (["--preload", "my-model"], "'my-model' is not a module name"),
    ],
)
async def test_bad_preload_flags_fail_in_one_line(argv: list[str], expected: str) -> None:
    """A --preload that cannot apply: one line, status 2."""
    with anyio.fail_after(BOUND):
        async with launched(*STANDALONE, "1", *argv, PROBE) as run:
            assert await run.wait() == 2, run
    assert expected in run.err.text


# -- a template that dies ---------------------------------------------------------------------


async def test_a_template_that_dies_is_restarted_and_the_job_finishes() -> None:
    """Rank 0 kills the template: its forks die with it, an event says so, the template is
    restarted and the job finishes (after a group restart; or, when the template died before
    answering rank 0's fork, with rank 0 started plainly in the same attempt)."""
    argv = [*STANDALONE, "2", "--max-restarts", "2", "--preload", "json"]
    with anyio.fail_after(BOUND):
        async with launched(*argv, str(WORKERS / "preload_kills_template.py")) as run:
            status = await run.wait()
    assert status == 0, run
    assert re.search(r"fork template \(pid \d+\) lost: it died .*restarting it", run.err.text), run
    assert re.search(r"done rank=0 attempt=[01]", run.out.text), run
    assert "run succeeded" in run.err.text
    assert "Traceback" not in run.err.text


def probe_command() -> list[str]:
    return [sys.executable, "-u", PROBE]


async def spawn_probe(template: Template, rank: int) -> tuple[WorkerProcess, dict[str, Any]]:
    """Start the probe through ``template`` (or plainly) and read its report."""
    reader, writer = os.pipe()
    env = {**os.environ, "RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": "0"}
    try:
        worker = WorkerProcess.spawn(probe_command(), env, stdout=writer, template=template)
    finally:
        os.close(writer)
    await worker.watch()
    with os.fdopen(reader, "rb") as out:
        text = out.read().decode()
    (report,) = probes(text)
    return worker, report


async def test_the_template_api_restarts_a_dead_template_then_falls_back() -> None:
    """Template direct: a killed template is replaced (TemplateLost restarting, TemplateReady
    again); with no restart left, workers start plainly and the event says so for good."""
    events: list[AgentEvent] = []
    command = python_command(probe_command())
    async with Template(
        command, ["preload_marker"], env=os.environ, emit=events.append, max_restarts=1
    ) as template:
        with anyio.fail_after(BOUND):
            await template.wait_ready()
            first = template.pid
            worker, report = await spawn_probe(template, 0)
            assert worker.forked
            assert worker.returncode == 0
            assert report["ppid"] == first
            assert first is not None
            os.kill(first, signal.SIGKILL)
            await wait_gone(first)
            while len([e for e in events if isinstance(e, TemplateReady)]) < 2:
                worker, report = await spawn_probe(template, 1)  # plain until the new one is ready
                if not worker.forked:
                    assert report["preloaded"] == []
            worker, report = await spawn_probe(template, 1)
            second = template.pid
            assert second not in (None, first)
            assert report["ppid"] == second
            assert second is not None
            os.kill(second, signal.SIGKILL)
            await wait_gone(second)
            worker, report = await spawn_probe(template, 2)
    assert not worker.forked
    assert report["ppid"] == os.getpid()
    lost = [e for e in events if isinstance(e, TemplateLost)]
    assert [e.restarting for e in lost] == [True, False]
    assert lost[0].pid == first


async def test_more_modules_can_be_imported_before_the_next_fork() -> None:
    """import_modules() preloads more: the next fork has them; a failing one raises."""
    command = python_command(probe_command())
    async with Template(command, ["json"], env=os.environ, emit=lambda _: None) as template:
        with anyio.fail_after(BOUND):
            await template.wait_ready()
            await template.import_modules(["fractions", "preload_marker"])
            _, report = await spawn_probe(template, 0)
            with pytest.raises(PreloadError, match="preloading 'no_such_module_y' failed"):
                await template.import_modules(["no_such_module_y"])
            worker, _ = await spawn_probe(template, 1)
            statistics = template.statistics()
    assert report["preloaded"] == ["fractions", "preload_marker"]
    assert (statistics.forks, statistics.plain_starts, statistics.starts) == (2, 0, 1)
    assert worker.forked  # a failed import leaves the template usable
    assert template.modules == ("json", "fractions", "preload_marker")


async def test_an_import_that_starts_a_thread_replaces_the_template() -> None:
    """A module that leaves the template unsafe is refused; a new template (without it) runs."""
    events: list[AgentEvent] = []
    command = python_command(probe_command())
    async with Template(command, ["json"], env=os.environ, emit=events.append) as template:
        with anyio.fail_after(BOUND):
            await template.wait_ready()
            with pytest.raises(PreloadError, match="metrics-flusher"):
                await template.import_modules(["preload_thread"])
            while len([e for e in events if isinstance(e, TemplateReady)]) < 2:
                await spawn_probe(template, 0)
            worker, _ = await spawn_probe(template, 0)
    assert worker.forked
    assert any(isinstance(e, TemplateLost) and e.restarting for e in events)


# -- real work after a fork (torch) -------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.skipif(not _importable("torch"), reason="torch is not installed")
async def test_forked_torch_workers_compute_and_all_reduce_over_gloo() -> None:
    """Preloaded torch: each fork runs a parallel matmul, a backward pass and a gloo
    all_reduce; the restarted group (forked again) does too."""
    script = str(WORKERS / "preload_torch_work.py")
    argv = [*STANDALONE, "2", "--max-restarts", "1", "--preload", "torch", script]
    with anyio.fail_after(BOUND * 2):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 0, run
    (template,) = template_pids(run.err.text)
    for rank in range(2):
        assert f"rank {rank} attempt 1 parent {template}: grad ok, all_reduce 3.0" in run.out.text


@pytest.mark.torch
@pytest.mark.skipif(not _importable("torch"), reason="torch is not installed")
@pytest.mark.parametrize("spares", [0, 1])
async def test_an_in_place_replacement_is_a_fork_that_computes_and_all_reduces(
    spares: int, tmp_path: Path
) -> None:
    """Rank 2 dies: its replacement (a new fork, or a spare forked earlier) joins the
    survivors in generation 2, and every step there (matmul, backward, all_reduce) succeeds."""
    script = str(WORKERS / "preload_inplace_torch.py")
    argv = [*STANDALONE, "3", "--recovery", "in-place", "--spares", str(spares)]
    argv += ["--preload", "torch,aioelastic.worker", script, "--marker", str(tmp_path / "m")]
    with anyio.fail_after(BOUND * 3):
        async with launched(*argv) as run:
            status = await run.wait()
    assert status == 0, run
    (template,) = template_pids(run.err.text)
    fresh = re.findall(r"gen 2 rank 2 pid (\d+) parent (\d+) fresh 1", run.out.text)
    assert [int(parent) for _, parent in fresh] == [template], run
    assert "restarting the worker group" not in run.err.text
    for rank in range(3):
        assert f"gen 2 rank {rank} step 7 sum 3.0" in run.out.text
        assert f"done rank {rank} step 8" in run.out.text or rank == 2


async def test_the_preload_example_runs() -> None:
    """examples/agent_preload.py launches itself: both workers find the module preloaded, are
    children of one template, and draw different numbers."""
    with anyio.fail_after(BOUND * 2):
        done = await anyio.run_process([sys.executable, str(EXAMPLES / "agent_preload.py")])
    text = done.stdout.decode()
    lines = re.findall(r"rank (\d): \w+ preloaded=True parent=(\d+) draw=([\d.]+)", text)
    assert len(lines) == 2, text
    assert lines[0][1] == lines[1][1] == str(template_pids(text)[0])
    assert lines[0][2] != lines[1][2]


def test_the_pss_reader_of_the_benchmark_reads_this_process() -> None:
    """bench.preload reads a live process's PSS from smaps_rollup (0 for none)."""
    from bench.preload import descendants, pss_kib

    assert pss_kib(os.getpid()) > 0
    assert pss_kib(2**22 + 1) == 0
    assert os.getpid() in descendants(os.getppid())
