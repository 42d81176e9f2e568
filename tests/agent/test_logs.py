"""Where worker output goes (redirects, tee, rank filter) and the line-prefixing pump."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent import LogSpec, Std
from aioelastic.agent._logs import (
    SharedConsole,
    StreamPlan,
    StreamPump,
    line_prefix,
    plan_streams,
    prefix_lines,
)
from tests.agent.conftest import Console

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
        (
            LogSpec(inherit_console=True, tee=Std.ERR),
            0,
            (StreamPlan(True, None, inherit=True), StreamPlan(True, DIR / "0/stderr.log")),
        ),
        (
            LogSpec(inherit_console=True, local_ranks_filter=frozenset({0})),
            1,
            (StreamPlan(False, None), StreamPlan(False, None)),
        ),
    ],
    ids=[
        "console",
        "redirect-all",
        "tee-stderr",
        "per-rank",
        "filtered-out",
        "filtered-tee",
        "inherited-beside-tee",
        "inherited-filtered-out",
    ],
)
def test_stream_plans(logs: LogSpec, local_rank: int, expected: tuple[StreamPlan, ...]) -> None:
    """Each combination of redirects, tee and the rank filter sends streams where torchrun does."""
    assert plan_streams(logs, local_rank, DIR) == expected


def test_prefix_template_expands_rank_local_rank_and_role() -> None:
    """The prefix template knows ${rank}, ${local_rank} and ${role_name}."""
    template = "[${role_name}${local_rank}/${rank}]:"
    assert line_prefix(template, rank=5, local_rank=1, role_name="t") == b"[t1/5]:"


async def test_pump_prefixes_lines_and_tees_raw_bytes(tmp_path: Path) -> None:
    """Each line is prefixed once; the file gets the raw bytes; EOF ends an open line."""
    read_fd, write_fd = os.pipe()
    shown: list[bytes] = []
    log = tmp_path / "out.log"
    pump = StreamPump(
        read_fd, prefix=b"[3]: ", console=SharedConsole(shown.append), file=log.open("ab")
    )
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
    pump = StreamPump(read_fd, prefix=b"", console=SharedConsole(console), file=log.open("ab"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump.run)
        os.write(write_fd, b"one\n")
        await anyio.wait_all_tasks_blocked()
        os.write(write_fd, b"two\nthree")
        os.close(write_fd)
    assert len(attempts) == 1
    assert log.read_bytes() == b"one\ntwo\nthree"


@pytest.mark.parametrize(
    ("data", "at_start", "expected"),
    [
        (b"a\nb\n", True, (b"P a\nP b\n", True)),
        (b"tail", False, (b"tail", False)),
        (b"\r10%\r20%", True, (b"\rP 10%\rP 20%", False)),
        (b"x\r\ny", True, (b"P x\r\nP y", False)),
        (b"", True, (b"", True)),
    ],
    ids=["lines", "continued", "progress-bar", "crlf", "empty"],
)
def test_prefix_lines(data: bytes, at_start: bool, expected: tuple[bytes, bool]) -> None:
    """A prefix starts every line (after \\n or \\r), once, and only before its first byte."""
    assert prefix_lines(data, b"P ", at_start) == expected


@given(st.binary(), st.lists(st.integers(min_value=0, max_value=64)))
def test_prefix_lines_does_not_depend_on_how_output_is_split(data: bytes, cuts: list[int]) -> None:
    """Feeding the chunks one by one gives what feeding the whole output gives."""
    whole, _ = prefix_lines(data, b"[0]: ", True)
    pieces, at_start, start = [], True, 0
    for cut in sorted(cuts):
        piece, at_start = prefix_lines(data[start:cut], b"[0]: ", at_start)
        pieces.append(piece)
        start = max(start, cut)
    piece, _ = prefix_lines(data[start:], b"[0]: ", at_start)
    assert b"".join([*pieces, piece]) == whole
    assert whole.replace(b"[0]: ", b"") == data.replace(b"[0]: ", b"")


async def test_pump_shows_a_partial_line_before_its_newline() -> None:
    """A prompt or a progress bar without a newline reaches the console at once."""
    read_fd, write_fd = os.pipe()
    shown = Console()
    pump = StreamPump(read_fd, prefix=b"[1]: ", console=SharedConsole(shown.write), file=None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump.run)
        os.write(write_fd, b"\rprogress 50%")
        await shown.wait_for("\r[1]: progress 50%")
        os.close(write_fd)
    assert shown.data == b"\r[1]: progress 50%\n"


async def test_a_line_left_open_is_ended_before_another_workers_output() -> None:
    """Rank 0's open line ends before rank 1's line; rank 0 resumes on a new, prefixed line."""
    shown = Console()
    console = SharedConsole(shown.write)
    pipes = [os.pipe() for _ in range(2)]
    async with anyio.create_task_group() as tg:
        for rank, (read_fd, _) in enumerate(pipes):
            tg.start_soon(
                StreamPump(read_fd, prefix=f"[{rank}]: ".encode(), console=console, file=None).run
            )
        os.write(pipes[0][1], b"50%")
        await shown.wait_for("50%")
        os.write(pipes[1][1], b"line\n")
        await shown.wait_for("line")
        os.write(pipes[0][1], b" more\n")
        for _, write_fd in pipes:
            os.close(write_fd)
    assert shown.data == b"[0]: 50%\n[1]: line\n[0]:  more\n"
