"""Step marks: ``world.step(n)``, cheap enough to call every step, batched to the agent.

A worker started by ``aioelastic run`` gets the worker's end of a one-way socket (a
``SOCK_SEQPACKET`` pair; its number in ``AIOELASTIC_STEPS_FD``). :meth:`StepMarks.mark` only
reads the clock and appends to a buffer; the buffer goes to the agent as one datagram (a JSON
header and packed arrays, see :func:`encode_batch`) when it is older than :data:`FLUSH_EVERY`,
when it is full, when the world changes and when the process exits normally. A send that would
block drops the batch (and counts it): a step never waits for the agent. Without an agent
(torchrun, no launcher) a mark is a no-op.

A batch says, for one world (restart count, generation, rank): when each marked step began
(Unix time, this host's clock, as the agent's event log), when the rank finished its own work
of a step (``world.work_done()``: before the step's collective; the straggler score uses it)
and the checkpoint saves the user marked (``with world.saving_checkpoint():``).

:func:`mark_step` is the one entry point for other parts of the worker API (``should_stop(step)``
implies a mark).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

STEPS_FD_ENV = "AIOELASTIC_STEPS_FD"
"""The environment variable naming the worker's end of its step-marks socket."""

FLUSH_EVERY = 0.5
"""Seconds a mark may wait in the buffer before the batch goes to the agent."""

MAX_MARKS = 1024
"""Marks in one batch at most (a full buffer is sent at once)."""

MAX_BATCH = 64 * 1024
"""Bytes of one encoded batch at most: a longer datagram is not a batch of this protocol."""

VERSION = 1
"""The batch format's version (the first number of its header)."""


class StepMarksError(ValueError):
    """A datagram on the step-marks socket is not a batch of this protocol."""


@dataclass(frozen=True, slots=True)
class StepBatch:
    """What one worker marked in one world since its last batch (times: Unix seconds)."""

    restart_count: int
    generation: int
    rank: int
    steps: tuple[int, ...]
    times: tuple[float, ...]
    """``times[i]``: when step ``steps[i]`` began."""
    done: tuple[tuple[int, float], ...] = ()
    """``(step, time)``: when this rank finished its own work of ``step`` (``work_done()``)."""
    saves: tuple[tuple[float, float], ...] = ()
    """``(start, end)`` of each checkpoint save the user marked."""


def encode_batch(batch: StepBatch) -> bytes:
    """One datagram: a JSON header line, then the marks packed as native arrays (``q`` steps,
    ``d`` times: the encoding costs about nothing per mark, unlike a float's decimal form)."""
    header = json.dumps(
        [
            VERSION,
            batch.restart_count,
            batch.generation,
            batch.rank,
            len(batch.steps),
            len(batch.done),
            len(batch.saves),
        ]
    ).encode()
    return b"".join(
        (
            header,
            b"\n",
            array("q", batch.steps).tobytes(),
            array("d", batch.times).tobytes(),
            array("q", [s for s, _ in batch.done]).tobytes(),
            array("d", [t for _, t in batch.done]).tobytes(),
            array("d", [t for save in batch.saves for t in save]).tobytes(),
        )
    )


def decode_batch(data: bytes) -> StepBatch:
    """Parse what :func:`encode_batch` wrote; raise :class:`StepMarksError` naming the fault."""
    if len(data) > MAX_BATCH:
        raise StepMarksError(f"a batch of {len(data)} bytes (at most {MAX_BATCH})")
    head, newline, body = data.partition(b"\n")
    try:
        version, restart_count, generation, rank, marks, done, saves = (
            _int(v) for v in json.loads(head)
        )
    except (ValueError, TypeError) as exc:
        raise StepMarksError(f"not a batch of step marks: {data[:80]!r} ({exc})") from None
    if version != VERSION or not newline:
        raise StepMarksError(f"not a batch of step marks of version {VERSION}: {data[:80]!r}")
    if min(marks, done, saves) < 0 or len(body) != 8 * (2 * marks + 2 * done + 2 * saves):
        raise StepMarksError(
            f"a batch of {marks} marks, {done} work ends and {saves} saves cannot be "
            f"{len(body)} bytes long"
        )
    numbers: list[array[Any]] = []
    offset = 0
    for code, count in (("q", marks), ("d", marks), ("q", done), ("d", done), ("d", 2 * saves)):
        values = array(code)
        values.frombytes(body[offset : offset + 8 * count])
        numbers.append(values)
        offset += 8 * count
    steps, times, done_steps, done_times, save_times = numbers
    return StepBatch(
        restart_count,
        generation,
        rank,
        tuple(steps),
        tuple(times),
        tuple(zip(done_steps, done_times, strict=True)),
        tuple(zip(save_times[::2], save_times[1::2], strict=True)),
    )


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


class StepMarks:
    """This process's buffer of step marks and where it goes (``send``: one datagram).

    ``send`` returns False where the datagram could not go now (the agent is behind): the
    batch is dropped and counted in :attr:`dropped`.
    """

    def __init__(
        self,
        send: Callable[[bytes], bool] | None,
        *,
        restart_count: int = 0,
        clock: Callable[[], float] = time.time,
        flush_every: float = FLUSH_EVERY,
    ) -> None:
        self._send = send
        self._clock = clock
        self._flush_every = flush_every
        self.restart_count = restart_count
        self._world: tuple[int, int] = (0, 0)
        self._steps: list[int] = []
        self._times: list[float] = []
        self._done: list[tuple[int, float]] = []
        self._saves: list[tuple[float, float]] = []
        self._due = 0.0
        self.sent = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        """Whether marks go anywhere (an agent listens)."""
        return self._send is not None

    def mark(self, generation: int, rank: int, step: int) -> None:
        """Step ``step`` of ``rank`` in world ``generation`` begins now (the hot path)."""
        if self._send is None:
            return
        now = self._clock()
        if (generation, rank) != self._world:
            self.flush()
            self._world = (generation, rank)
        self._steps.append(step)
        self._times.append(now)
        if now >= self._due or len(self._steps) >= MAX_MARKS:
            self.flush(now)

    def work_done(self, generation: int, rank: int) -> None:
        """This rank finished its own work of the step it marked last (before the collective)."""
        if self._send is None or not self._steps or (generation, rank) != self._world:
            return
        self._done.append((self._steps[-1], self._clock()))
        if len(self._done) >= MAX_MARKS:
            self.flush()

    @contextmanager
    def saving(self, generation: int, rank: int) -> Iterator[None]:
        """Mark the block as a checkpoint save (its time is badput, not training)."""
        if self._send is None:
            yield
            return
        if (generation, rank) != self._world:
            self.flush()
            self._world = (generation, rank)
        start = self._clock()
        try:
            yield
        finally:
            self._saves.append((start, self._clock()))
            if len(self._saves) >= MAX_MARKS:
                self.flush()

    def flush(self, now: float | None = None) -> None:
        """Send what the buffer holds (if anything) as one batch."""
        now = self._clock() if now is None else now
        self._due = now + self._flush_every
        if self._send is None or not (self._steps or self._done or self._saves):
            return
        generation, rank = self._world
        batch = StepBatch(
            self.restart_count,
            generation,
            rank,
            tuple(self._steps),
            tuple(self._times),
            tuple(self._done),
            tuple(self._saves),
        )
        self._steps.clear()
        self._times.clear()
        self._done.clear()
        self._saves.clear()
        if self._send(encode_batch(batch)):
            self.sent += 1
        else:
            self.dropped += 1

    def close(self) -> None:
        """Flush, then mark nothing more."""
        self.flush()
        self._send = None


def _socket_sender(sock: socket.socket) -> Callable[[bytes], bool]:
    sock.setblocking(False)

    def send(data: bytes) -> bool:
        try:
            sock.send(data)
        except (BlockingIOError, OSError):
            return False  # the agent is behind, or gone: a step never waits for it
        return True

    return send


def _from_env() -> StepMarks:
    """This process's marks: to the agent's socket if ``aioelastic run`` gave one, else none."""
    raw = os.environ.pop(STEPS_FD_ENV, None)  # a child of this worker is not linked
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if not raw:
        return StepMarks(None, restart_count=restart_count)
    try:
        sock = socket.socket(fileno=int(raw))
        sock.set_inheritable(False)
    except (ValueError, OSError):
        return StepMarks(None, restart_count=restart_count)  # not ours (copied environment)
    return StepMarks(_socket_sender(sock), restart_count=restart_count)


_MARKS: StepMarks | None = None


def marks() -> StepMarks:
    """This process's :class:`StepMarks` (set up on first use; flushed at exit)."""
    global _MARKS
    if _MARKS is None:
        _MARKS = _from_env()
        atexit.register(_MARKS.close)
    return _MARKS


def _forget_in_child() -> None:
    """A forked child (a data-loader worker) marks nothing: the socket is its parent's."""
    global _MARKS
    if _MARKS is not None:
        _MARKS._send = None
        _MARKS = StepMarks(None)


os.register_at_fork(after_in_child=_forget_in_child)


def mark_step(generation: int, rank: int, step: int) -> None:
    """Mark that ``step`` begins now on ``rank`` of world ``generation`` (what ``world.step``
    does; ``world.should_stop(step)`` calls it too)."""
    marks().mark(generation, rank, step)
