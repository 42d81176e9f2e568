"""`aioelastic run --events-file` and `aioelastic timeline` end to end, with real workers."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import anyio
import pytest

from aioelastic.events import read_event_log

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """These tests drive subprocesses: one event loop is enough to wait for them."""
    return "asyncio"


FAIL_ONCE = """\
import os, sys
if os.environ["LOCAL_RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
"""
BOUND = 60
"""Generous bound (seconds) for a job of real processes on a loaded 2-core machine."""


async def aioelastic(*args: str | Path) -> tuple[int, str]:
    with anyio.fail_after(BOUND):
        done = await anyio.run_process(
            [sys.executable, "-m", "aioelastic", *map(str, args)], check=False
        )
    return done.returncode, (done.stdout + done.stderr).decode()


async def test_a_failed_worker_and_its_restart_are_in_the_events_file(tmp_path: Path) -> None:
    """A worker that fails once: the log shows the failure, the restart, and success."""
    worker = tmp_path / "worker.py"
    worker.write_text(FAIL_ONCE)
    events = tmp_path / "events.jsonl"
    code, output = await aioelastic(
        "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
        "--events-file", events, worker,
    )  # fmt: skip
    assert code == 0, output
    logged = list(read_event_log(events))
    kinds = [e.kind for e in logged]
    assert kinds.count("WorkersStarted") == 2
    assert kinds.index("WorkerFailed") < kinds.index("GroupRestarting")
    assert kinds[-1] == "RunFinished"
    assert logged[-1].data["result"]["state"] == "succeeded"
    failed = next(e for e in logged if e.kind == "WorkerFailed")
    assert (failed.data["failure"]["rank"], failed.data["failure"]["returncode"]) == (1, 3)


async def test_the_timeline_command_draws_a_run(tmp_path: Path) -> None:
    """`aioelastic timeline` turns a run's events file into a PNG and says what it drew."""
    pytest.importorskip("matplotlib", reason="needs the timeline extra (matplotlib)")
    worker = tmp_path / "worker.py"
    worker.write_text(FAIL_ONCE)
    events, picture = tmp_path / "events.jsonl", tmp_path / "run.png"
    code, output = await aioelastic(
        "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
        "--events-file", events, worker,
    )  # fmt: skip
    assert code == 0, output
    code, output = await aioelastic("timeline", events, "-o", picture)
    assert code == 0, output
    assert "3 lanes" in output
    assert picture.read_bytes()[:4] == b"\x89PNG"


async def test_an_events_file_in_a_missing_directory_fails_before_starting(
    tmp_path: Path,
) -> None:
    """An unusable --events-file is one line naming it, and no worker starts."""
    marker = tmp_path / "started"
    worker = tmp_path / "worker.py"
    worker.write_text(f"open({str(marker)!r}, 'w').close()\n")
    code, output = await aioelastic(
        "run", "--standalone", "--events-file", tmp_path / "no" / "events.jsonl", worker
    )
    assert code == 2
    assert "cannot open the event log" in output
    assert len(output.strip().splitlines()) == 1
    assert not marker.exists()


async def test_a_bad_events_file_is_a_one_line_timeline_error(tmp_path: Path) -> None:
    """`aioelastic timeline` on a file that is not an event log names the file and line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"time": 1, "node": "a", "source": "agent", "kind": "X", "event": {}}\nnope\n')
    code, output = await aioelastic("timeline", bad, "-o", tmp_path / "out.png")
    assert code == 2
    assert f"{bad}:2: not JSON" in output


async def test_a_worker_can_scrape_the_agents_metrics(tmp_path: Path) -> None:
    """With --metrics-port, the agent serves Prometheus metrics while its workers run."""
    pytest.importorskip("prometheus_client", reason="needs the metrics extra (prometheus-client)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    scraped = tmp_path / "metrics.txt"
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, urllib.request\n"
        "if os.environ['LOCAL_RANK'] == '0':\n"
        f"    with urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=30) as r:\n"
        f"        open({str(scraped)!r}, 'wb').write(r.read())\n"
    )
    code, output = await aioelastic(
        "run", "--standalone", "--nproc-per-node", "2", "--metrics-port", str(port), worker
    )
    assert code == 0, output
    text = scraped.read_text()
    assert "aioelastic_world_size 2.0" in text
    assert "aioelastic_rendezvous_rounds_total 1.0" in text


HANGS_ONCE = """\
import os, threading
from aioelastic import timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
with timer.expires(after=0.5, scope="step"):
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        threading.Event().wait()  # hung: only the watchdog ends this
"""


async def test_the_watchdogs_own_events_are_in_the_events_file(tmp_path: Path) -> None:
    """A hung step: the timer's expired and reaped events sit next to the agent's."""
    worker = tmp_path / "worker.py"
    worker.write_text(HANGS_ONCE)
    events = tmp_path / "events.jsonl"
    code, output = await aioelastic(
        "run", "--standalone", "--max-restarts", "1", "--events-file", events, worker
    )
    assert code == 0, output
    logged = list(read_event_log(events))
    timer_kinds = [e.kind for e in logged if e.source == "timer"]
    assert timer_kinds[:2] == ["TimerExpired", "TimerReaped"]  # per-step arms stay out
    reaped = next(e for e in logged if e.kind == "TimerReaped")
    agent_reaped = next(e for e in logged if e.kind == "WorkerReaped")
    assert reaped.data["scope_id"] == agent_reaped.data["scope_id"] == "step"
    assert reaped.data["pid"] == agent_reaped.data["pid"]


LEARNS = """\
import json, os, sys, urllib.request
from aioelastic import timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
for _ in range(3):
    with timer.expires(after="auto", scope="step"):
        pass
port, out = sys.argv[1], sys.argv[2]
for what in ("metrics", "learned"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{what}", timeout=30) as reply:
        open(os.path.join(out, what), "wb").write(reply.read())
"""


async def test_learned_timeouts_reach_the_metrics_and_the_learned_endpoint(tmp_path: Path) -> None:
    """A worker's expires(after="auto") blocks are observations the agent serves: a gauge per
    scope and /learned (what `aioelastic status --timers` prints), kept under --log-dir."""
    pytest.importorskip("prometheus_client", reason="needs the metrics extra (prometheus-client)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = tmp_path / "worker.py"
    worker.write_text(LEARNS)
    logs = tmp_path / "logs"
    code, output = await aioelastic(
        "run", "--standalone", "--metrics-port", str(port), "--log-dir", logs,
        worker, str(port), str(tmp_path),
    )  # fmt: skip
    assert code == 0, output
    assert 'aioelastic_learned_timeout_seconds{scope="step"} 1800.0' in (
        (tmp_path / "metrics").read_text()
    )
    learned = json.loads((tmp_path / "learned").read_text())
    assert learned["step"]["observations"] == 3
    assert learned["step"]["limit"] == 1800.0  # still warming up
    (kept,) = (logs / "learned-timeouts").iterdir()  # one directory per run id
    assert [p.name for p in kept.iterdir()] == ["0.json"]
