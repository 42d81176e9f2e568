"""Step marks on the worker's side: the buffer, its batches, the codec and the socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.worker import _steps
from aioelastic.worker._steps import (
    StepBatch,
    StepMarks,
    StepMarksError,
    decode_batch,
    encode_batch,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recorder(accept: bool = True) -> tuple[list[StepBatch], StepMarks, Clock]:
    sent: list[StepBatch] = []
    clock = Clock()

    def send(data: bytes) -> bool:
        sent.append(decode_batch(data))
        return accept

    return sent, StepMarks(send, restart_count=2, clock=clock, flush_every=0.5), clock


def test_marks_wait_in_the_buffer_until_it_is_due() -> None:
    """Marks go together, in one batch, once the oldest waited the flush interval."""
    sent, marks, clock = recorder()
    marks.mark(1, 0, 0)
    for step in (1, 2):
        clock.now += 0.125
        marks.mark(1, 0, step)
    assert sent == []
    clock.now += 0.25
    marks.mark(1, 0, 3)
    assert [b.steps for b in sent] == [(0, 1, 2, 3)]
    assert sent[0].times == (100.0, 100.125, 100.25, 100.5)
    assert (sent[0].restart_count, sent[0].generation, sent[0].rank) == (2, 1, 0)


def test_a_new_world_sends_the_old_worlds_marks_first() -> None:
    """Marks of one batch are all of one world: a change of generation flushes."""
    sent, marks, clock = recorder()
    marks.mark(1, 0, 0)
    clock.now += 0.125
    marks.mark(1, 0, 1)
    marks.mark(2, 1, 1)
    marks.flush()
    assert [(b.generation, b.rank, b.steps) for b in sent] == [(1, 0, (0, 1)), (2, 1, (1,))]


def test_work_done_and_checkpoint_saves_travel_with_the_marks() -> None:
    """``work_done`` notes the current step's end of work; a save notes its start and end."""
    sent, marks, clock = recorder()
    marks.mark(1, 0, 0)
    clock.now += 0.2
    marks.mark(1, 0, 1)
    clock.now += 0.1
    marks.work_done(1, 0)
    with marks.saving(1, 0):
        clock.now += 0.05
    marks.flush()
    assert sent[-1].done == ((1, pytest.approx(100.3)),)
    assert sent[-1].saves == ((pytest.approx(100.3), pytest.approx(100.35)),)


def test_a_batch_the_agent_cannot_take_now_is_dropped_and_counted() -> None:
    """A send that would block never holds the step: the batch is dropped, counted."""
    _, marks, _ = recorder(accept=False)
    marks.mark(1, 0, 0)
    marks.flush()
    assert (marks.sent, marks.dropped) == (0, 1)


def test_without_an_agent_a_mark_is_a_no_op() -> None:
    """No sender (not under ``aioelastic run``): nothing is kept, nothing fails."""
    marks = StepMarks(None)
    marks.mark(1, 0, 0)
    marks.work_done(1, 0)
    with marks.saving(1, 0):
        pass
    marks.flush()
    assert (marks.enabled, marks.sent, marks.dropped) == (False, 0, 0)


batches = st.builds(
    StepBatch,
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(-1, 10**6),
    st.lists(st.integers(-(10**9), 10**9), max_size=5).map(tuple),
    st.just(()),
    st.lists(st.tuples(st.integers(0, 10**6), st.floats(0, 2e9)), max_size=3).map(tuple),
    st.lists(st.tuples(st.floats(0, 2e9), st.floats(0, 2e9)), max_size=3).map(tuple),
).map(lambda b: StepBatch(
    b.restart_count, b.generation, b.rank, b.steps, tuple(map(float, b.steps)), b.done, b.saves
))  # fmt: skip


@given(batches)
def test_batches_survive_the_wire(batch: StepBatch) -> None:
    """What ``encode_batch`` writes, ``decode_batch`` reads back unchanged."""
    assert decode_batch(encode_batch(batch)) == batch


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"nope", "not a batch of step marks"),
        (b"[1, 0, 1, 0, 1, 0, 0]", "not a batch of step marks of version 1"),
        (b"[2, 0, 1, 0, 0, 0, 0]\n", "of version 1"),
        (b"[1, 0, 1, 0, 1, 0, 0]\n" + bytes(8), "1 marks, 0 work ends and 0 saves cannot be 8"),
        (b'[1, 0, 1, "0", 0, 0, 0]\n', "an integer"),
        (b"x" * (_steps.MAX_BATCH + 1), "at most"),
    ],
)
def test_a_bad_datagram_is_a_step_marks_error(data: bytes, match: str) -> None:
    """A datagram that is no batch of this protocol says what is wrong with it."""
    with pytest.raises(StepMarksError, match=match):
        decode_batch(data)


def test_a_worker_sends_its_marks_to_the_socket_it_was_given() -> None:
    """A process started with ``AIOELASTIC_STEPS_FD`` sends its marks there, the last batch at
    exit; the variable is gone from its environment once ``worlds()`` began (its children are
    not linked)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    code = (
        "import os\n"
        "from aioelastic.worker import worlds\n"
        "for world in worlds():\n"
        "    assert 'AIOELASTIC_STEPS_FD' not in os.environ\n"
        "    with world:\n"
        "        for step in range(3):\n"
        "            world.step(step)\n"
    )
    env = {"AIOELASTIC_STEPS_FD": str(theirs.fileno()), "RANK": "1", "WORLD_SIZE": "2",
           "TORCHELASTIC_RESTART_COUNT": "3", "PATH": "/usr/bin:/bin"}  # fmt: skip
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    with ours, theirs:
        subprocess.run(
            [sys.executable, "-c", code], env=env, pass_fds=[theirs.fileno()], check=True,
            timeout=60,
        )  # fmt: skip
        ours.setblocking(False)
        got = []
        while True:
            try:
                got.append(decode_batch(ours.recv(_steps.MAX_BATCH)))
            except BlockingIOError:
                break
    assert [s for b in got for s in b.steps] == [0, 1, 2]
    assert {(b.restart_count, b.generation, b.rank) for b in got} == {(3, 4, 1)}
