"""The worker's side of a job-wide preemption: ``world.should_stop(step)``.

``aioelastic run`` gives each worker the path of its agent's preemption socket
(``AIOELASTIC_PREEMPT_SOCKET``). The first ``should_stop`` connects to it (once per process)
and says which rank this is (:class:`Join`): from then on the agent does not forward a shutdown
signal to this process (a worker that never asks gets it), it tells it (:class:`Notice`), and
the rank stops at the step the job agrees (``_stop_step.py``). Until a notice arrives,
:func:`should_stop` is one non-blocking ``recv`` on the socket; afterwards it asks the agent at
each boundary until the stop step is known (a step or two). Without an agent it is always
False.
"""

from __future__ import annotations

import logging
import os
import select
import socket

from aioelastic.worker._link import AgentLinkError
from aioelastic.worker._stop_step import (
    PREEMPT_SOCKET_ENV,
    Answer,
    Ask,
    Gate,
    Join,
    Notice,
    PreemptLines,
    PreemptMessage,
    StopAt,
    Stopping,
    Verdict,
    encode_message,
)

logger = logging.getLogger("aioelastic.worker")


class PreemptionLink:
    """This process's connection to its agent's preemption socket (see the module docstring)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._lines = PreemptLines()
        self._answers: dict[int, int | None] = {}
        self.gate = Gate()
        self.rank: int | None = None
        self.notice: Notice | None = None
        self._stopping_said = False
        self.broken: str | None = None
        """Why the link no longer works (the agent went away); should_stop is False then."""

    @classmethod
    def connect(cls, path: str) -> PreemptionLink:
        """Connect to the agent's socket at ``path``; raise :class:`AgentLinkError`."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise AgentLinkError(
                f"cannot reach the agent's preemption socket {path} ({exc}); was "
                f"{PREEMPT_SOCKET_ENV} copied from another process's environment?"
            ) from None
        return cls(sock)

    def join(self, rank: int) -> None:
        """Say this process holds ``rank`` (again when its rank changed)."""
        if rank != self.rank:
            self.rank = rank
            self._send(Join(os.getpid(), rank))

    def should_stop(self, step: int) -> bool:
        """True once this rank reached the job's stop step (see the module docstring)."""
        if self.broken is not None:
            return False
        try:
            self._poll()
            verdict = self.gate.at(step)
            if verdict is Verdict.ASK:
                self._send(Ask(step))
                while step not in self._answers:
                    select.select([self._sock], [], [])
                    self._poll()
                verdict = self.gate.answered(step, self._answers.pop(step))
            if verdict is Verdict.STOP and not self._stopping_said:
                self._stopping_said = True
                self._send(Stopping(step))
        except AgentLinkError as exc:
            self.broken = str(exc)
            logger.warning("preemption: %s; should_stop() is False from now on", exc)
            return False
        return verdict is Verdict.STOP

    @property
    def stop_step(self) -> int | None:
        """The step the job stops at, once known."""
        return self.gate.stop_step

    def _send(self, message: PreemptMessage) -> None:
        data = encode_message(message)
        while data:
            try:
                data = data[self._sock.send(data) :]
            except BlockingIOError:
                select.select([], [self._sock], [])
            except OSError as exc:
                raise AgentLinkError(f"the agent is gone ({exc})") from None

    def _poll(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                raise AgentLinkError(f"the agent is gone ({exc})") from None
            if not data:
                raise AgentLinkError("the agent closed the preemption link")
            for message in self._lines.feed(data):
                self._note(message)

    def _note(self, message: PreemptMessage) -> None:
        match message:
            case Notice():
                self.notice = message
                self.gate.noticed()
            case StopAt():
                self.gate.stop_at(message.stop_step)
            case Answer():
                self._answers[message.step] = message.stop_step
            case _:
                raise AgentLinkError(f"the agent sent a worker's message: {message}")


_LINK: PreemptionLink | None = None


def joined(rank: int) -> PreemptionLink | None:
    """This process's preemption link, connected on first use and told its ``rank``; None
    without an agent (no ``AIOELASTIC_PREEMPT_SOCKET``, or it cannot be reached: a warning
    says why, and the agent forwards its signal to this process as to a plain worker)."""
    global _LINK
    if _LINK is None:
        path = os.environ.get(PREEMPT_SOCKET_ENV)
        if not path:
            return None
        os.environ.pop(PREEMPT_SOCKET_ENV)  # a child of this worker is not this rank
        try:
            _LINK = PreemptionLink.connect(path)
        except AgentLinkError as exc:
            logger.warning("preemption: %s; should_stop() is always False", exc)
            return None
    try:
        _LINK.join(rank)
    except AgentLinkError as exc:
        _LINK.broken = str(exc)
    return _LINK


def should_stop(rank: int, step: int) -> bool:
    """``world.should_stop(step)`` for a process holding ``rank``."""
    link = joined(rank)
    return False if link is None else link.should_stop(step)
