"""Where worker output goes (redirects, tee, rank filter) and the line-prefixing pump."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from aioelastic.agent import LogSpec, Std
from aioelastic.agent._logs import StreamPlan, StreamPump, line_prefix, plan_streams

pytestmark = pytest.mark.anyio

DIR = Path("/logs/attempt_0")


@pytest.mark.parametrize(
    ("logs", "local_rank", "expected"),
    [
        (LogSpec(), 0, (StreamPlan(True, None), StreamPlan(True, None))),
        (
            LogSpec(redirects=Std.ALL),
            1,
            (StreamPlan(False, DIR / "1/stdout.log"), StreamPlan(False, DIR / "1/stderr.log")),
        ),
        (
            LogSpec(tee=Std.ERR),
            0,
            (StreamPlan(True, None), StreamPlan(True, DIR / "0/stderr.log")),
        ),
        (
            LogSpec(redirects={1: Std.OUT}),
            0,
            (StreamPlan(True, None), StreamPlan(True, None)),
        ),
        (
            LogSpec(local_ranks_filter=frozenset({0})),
            1,
            (StreamPlan(False, None), StreamPlan(False, None)),
        ),
        (
            LogSpec(tee=Std.OUT, local_ranks_filter=frozenset({0})),
            1,
            (StreamPlan(False, DIR / "1/stdout.log"), StreamPlan(False, None)),
        ),
    ],
    ids=["console", "redirect-all", "tee-stderr", "per-rank", "filtered-out", "filtered-tee"],
)
def test_stream_plans(logs: LogSpec, local_rank: int, expected: tuple[StreamPlan, ...]) -> None:
    """Each combination of redirects, tee and the rank filter sends streams where torchrun does."""
    assert plan_streams(logs, local_rank, DIR) == expected


def test_prefix_template_expands_rank_local_rank_and_role() -> None:
    """The prefix template knows ${rank}, ${local_rank} and ${role_name}."""
    template = "[${role_name}${local_rank}/${rank}]:"
    assert line_prefix(template, rank=5, local_rank=1, role_name="t") == b"[t1/5]:"


async def test_pump_prefixes_lines_and_tees_raw_bytes(tmp_path: Path) -> None:
    """Lines split across writes are prefixed whole; the file gets the raw bytes; EOF flushes."""
    read_fd, write_fd = os.pipe()
    shown: list[bytes] = []
    log = tmp_path / "out.log"
    pump = StreamPump(read_fd, prefix=b"[3]: ", console=shown.append, file=log.open("ab"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump.run)
        os.write(write_fd, b"hel")
        os.write(write_fd, b"lo\nwor")
        os.write(write_fd, b"ld\nno newline")
        os.close(write_fd)
    assert b"".join(shown) == b"[3]: hello\n[3]: world\n[3]: no newline\n"
    assert log.read_bytes() == b"hello\nworld\nno newline"


async def test_pump_keeps_draining_when_the_console_breaks(tmp_path: Path) -> None:
    """A console that fails (closed pipe) is dropped after one try; the file gets everything."""
    read_fd, write_fd = os.pipe()
    attempts: list[bytes] = []

    def console(data: bytes) -> None:
        attempts.append(data)
        raise BrokenPipeError(32, "Broken pipe")

    log = tmp_path / "out.log"
    pump = StreamPump(read_fd, prefix=b"", console=console, file=log.open("ab"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump.run)
        os.write(write_fd, b"one\n")
        await anyio.wait_all_tasks_blocked()
        os.write(write_fd, b"two\nthree")
        os.close(write_fd)
    assert len(attempts) == 1
    assert log.read_bytes() == b"one\ntwo\nthree"
