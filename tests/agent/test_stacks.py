"""The pure side of hang forensics: parsing captures, placing ranks, naming the suspects."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from aioelastic.agent._stacks import (
    Frame,
    Place,
    ThreadStack,
    diagnose,
    parse_faulthandler,
    parse_py_spy,
    place_of,
    rank_ranges,
)

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"


def main(*frames: Frame) -> tuple[ThreadStack, ...]:
    return (ThreadStack("MainThread", frames, main=True),)


def test_py_spy_json_puts_the_main_thread_first() -> None:
    """py-spy's JSON dump becomes threads, innermost frame first, MainThread first."""
    dump = [
        {"thread_name": "worker", "frames": [{"name": "f", "filename": "/a.py", "line": 1}]},
        {"thread_name": "MainThread", "frames": [{"name": "g", "filename": "/b.py", "line": 2}]},
    ]
    threads = parse_py_spy(json.dumps(dump))
    assert [(t.name, t.main, t.frames) for t in threads] == [
        ("MainThread", True, (Frame("g", "/b.py", 2),)),
        ("worker", False, (Frame("f", "/a.py", 1),)),
    ]


def test_faulthandler_dump_takes_the_last_thread_as_main() -> None:
    """faulthandler lists the newest thread first; the main thread, listed last, is the main."""
    text = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "/w.py", line 5 in helper\n\n'
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/data.py", line 88 in load_batch\n'
        '  File "/train.py", line 3 in <module>\n'
    )
    threads = parse_faulthandler(text)
    assert [(t.main, [f.short for f in t.frames]) for t in threads] == [
        (True, ["data.py:88 load_batch", "train.py:3 <module>"]),
        (False, ["w.py:5 helper"]),
    ]


def test_a_rank_inside_a_collective_is_waiting_in_its_entry_point() -> None:
    """The torch.distributed entry point names the collective (its logging wrapper does not)."""
    threads = main(
        Frame("all_reduce", C10D, 3252),
        Frame("wrapper", LOGGER, 81),
        Frame("step", "/train.py", 9),
    )
    assert place_of(threads) == Place(True, "all_reduce")


def test_a_rank_elsewhere_is_stuck_in_its_own_innermost_frame() -> None:
    """Standard-library frames are skipped: the place is the program's own frame."""
    import threading

    threads = main(
        Frame("wait", threading.__file__, 320),
        Frame("load_batch", "/job/data.py", 88),
    )
    assert place_of(threads) == Place(False, "data.py:88 load_batch")


def test_the_rank_outside_the_collective_is_the_suspect() -> None:
    """Seven ranks wait in all_reduce for the eighth: it alone is suspected."""
    waiting = Place(True, "all_reduce")
    places = {rank: waiting for rank in range(8)} | {3: Place(False, "data.py:88 load_batch")}
    diagnosis = diagnose(places)
    assert diagnosis.suspects == (3,)
    assert diagnosis.summary == (
        "rank 3 stuck in data.py:88 load_batch; ranks 0-2 and 4-7 waiting in all_reduce"
    )


def test_when_every_rank_waits_the_minority_collective_is_suspected() -> None:
    """A rank in another collective than its peers is the one out of step."""
    places = {0: Place(True, "all_reduce"), 1: Place(True, "barrier"), 2: Place(True, "all_reduce")}
    assert diagnose(places).suspects == (1,)


def test_ranks_without_a_stack_are_named() -> None:
    """A rank whose capture failed is listed as having no stack, and is not a suspect."""
    diagnosis = diagnose({0: Place(False, "a.py:1 f"), 1: None})
    assert (diagnosis.suspects, diagnosis.missing) == ((0,), (1,))
    assert diagnosis.summary == "rank 0 stuck in a.py:1 f; rank 1: no stack"


@given(st.sets(st.integers(0, 40), min_size=1))
def test_rank_ranges_name_every_rank_once(ranks: set[int]) -> None:
    """The text lists exactly the given ranks (ranges expanded)."""
    text = rank_ranges(ranks).removeprefix("ranks ").removeprefix("rank ")
    named: list[int] = []
    for part in text.replace(" and ", ", ").split(", "):
        low, _, high = part.partition("-")
        named += range(int(low), int(high or low) + 1)
    assert sorted(named) == sorted(ranks)
