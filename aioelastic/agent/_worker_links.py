"""The agent's links to its in-place workers: starting each with two socket pairs, hearing
them, telling them.

Each worker under ``--recovery in-place`` is started with a link (hello, entered, trouble in;
its world, the end of a world out: ``aioelastic/worker/_protocol.py``) and an abort socket
(``aioelastic/worker/_abort.py``). :class:`LinkedWorkers` is the part of the in-place group that
does this I/O; what is heard goes, as a :data:`Notice`, to one stream the group's loop reads
(with each worker's exit, seen through its pidfd at once).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from aioelastic.agent._env import WorkerRanks
from aioelastic.agent._events import SpareStarted
from aioelastic.agent._generation_log import LogEntry
from aioelastic.agent._generation_types import Place, WorkerKey
from aioelastic.agent._group import WorkerGroup, _Worker
from aioelastic.agent._logs import line_prefix
from aioelastic.worker._abort import (
    ABORT_FD_ENV,
    AbortLines,
    AbortReply,
    AbortRequest,
    encode_abort,
)
from aioelastic.worker._protocol import (
    WORKER_FD_ENV,
    LineDecoder,
    Lines,
    LinkProtocolError,
    Message,
    encode,
)

logger = logging.getLogger("aioelastic.agent._recovery")

_M = TypeVar("_M")

SPARE_ENV = {"RANK": "-1", "LOCAL_RANK": "-1", "ROLE_RANK": "-1", "AIOELASTIC_SPARE": "1"}
"""What a spare's environment says of its ranks until it is placed: it holds none (-1, so
``init_process_group("env://")`` in a spare fails instead of joining as someone's rank);
``worker.worlds()`` sets the ranks of each world it yields."""


@dataclass(frozen=True, slots=True)
class _Exit:
    key: WorkerKey


@dataclass(frozen=True, slots=True)
class _Said:
    key: WorkerKey
    message: Message


@dataclass(frozen=True, slots=True)
class _Logged:
    entry: LogEntry


@dataclass(frozen=True, slots=True)
class _Answered:
    key: WorkerKey
    reply: AbortReply


Notice = _Exit | _Said | _Logged | _Answered
"""What the group's loop hears: an exit, a message, a log entry, an answer to an abort."""


@dataclass(slots=True)
class _Linked:
    key: WorkerKey
    worker: _Worker
    link: socket.socket
    abort: socket.socket
    """Where the agent asks the worker to abort its collectives (see worker/_abort.py)."""
    unsent: bytes = b""
    """What the link's buffer did not take yet (sent, in order, once it is writable)."""


class LinkedWorkers(WorkerGroup):
    """A worker group whose workers are linked to the agent (see the module docstring)."""

    _linked: dict[WorkerKey, _Linked]
    _tell: MemoryObjectSendStream[Notice]
    _pumps: TaskGroup
    _watchers: TaskGroup

    def _ask_abort(self, key: WorkerKey, generation: int) -> None:
        """Ask a survivor to abort the collectives of ``generation``, which lost a member."""
        linked = self._linked.get(key)
        if linked is None:
            return
        try:
            linked.abort.send(encode_abort(AbortRequest(generation)))
        except OSError as exc:  # gone: its pidfd says so
            logger.info("could not ask worker %s to abort: %s", key, exc)

    def _send(self, key: WorkerKey, message: Message) -> None:
        """Tell a worker something; a worker that is gone will be heard of through its pidfd."""
        linked = self._linked.get(key)
        if linked is None:  # a worker of an earlier life of this node (a replica replayed it)
            return
        data = encode(message)
        if linked.unsent:  # after what is waiting, never in the middle of it
            linked.unsent += data
            return
        try:
            sent = linked.link.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            logger.info("could not tell worker %s %s: %s", key, type(message).__name__, exc)
            return
        if sent < len(data):  # a full buffer (a long Warm list): the rest goes when it drains
            linked.unsent = data[sent:]
            scope = anyio.CancelScope(shield=True)  # bounded like the pumps
            self._pump_scopes.append(scope)
            self._pumps.start_soon(self._send_unsent, linked, scope)

    @staticmethod
    async def _send_unsent(linked: _Linked, scope: anyio.CancelScope) -> None:
        """Send what the link's buffer did not take, as it drains (the worker reads)."""
        with scope:
            while linked.unsent:
                await anyio.wait_writable(linked.link)
                try:
                    sent = linked.link.send(linked.unsent)
                except BlockingIOError:
                    continue
                except OSError as exc:  # gone: its pidfd says so
                    logger.info("could not tell worker %s the rest: %s", linked.key, exc)
                    linked.unsent = b""
                    return
                linked.unsent = linked.unsent[sent:]

    # -- processes and links --------------------------------------------------------------------

    def _ranks_for(self, slot: int | None) -> WorkerRanks:
        """The ranks ``slot`` is started with (a spare: slot 0's, for its streams and binding;
        its environment and console say it holds none, see :data:`SPARE_ENV`)."""
        return self.ranks[slot or 0]

    def _retitle(self, worker: _Worker, place: Place) -> None:
        """Show ``worker``'s console lines under the rank it now holds (a spare placed, or a
        survivor whose rank changed)."""
        prefix = line_prefix(
            self.spec.logs.line_prefix,
            rank=place.rank,
            local_rank=place.local_rank,
            role_name=self.spec.role,
        )
        for pump in worker.pumps:
            pump.retitle(prefix)

    def _spawn_linked(self, key: WorkerKey, slot: int | None) -> None:
        ours, theirs = socket.socketpair()
        abort, their_abort = socket.socketpair()
        env = {
            WORKER_FD_ENV: str(theirs.fileno()),
            ABORT_FD_ENV: str(their_abort.fileno()),
            "AIOELASTIC_RECOVERY": "in-place",
            **(SPARE_ENV if slot is None else {}),
        }
        try:
            worker = self._spawn(
                self._ranks_for(slot),
                self._pumps,
                tag=f"{slot if slot is not None else 'spare'}.{key.serial}",
                extra_env=env,
                pass_fds=(theirs.fileno(), their_abort.fileno()),
                shown_as="spare" if slot is None else None,
            )
        except BaseException:
            ours.close()
            abort.close()
            raise
        finally:
            theirs.close()
            their_abort.close()
        ours.setblocking(False)
        abort.setblocking(False)
        self.workers.append(worker)
        self._linked[key] = _Linked(key, worker, ours, abort)
        self._watchers.start_soon(self._watch_linked, key)
        scopes = [anyio.CancelScope(shield=True) for _ in range(2)]  # bounded like the pumps
        self._pump_scopes += scopes
        self._pumps.start_soon(self._read_link, key, scopes[0])
        self._pumps.start_soon(self._read_abort_answers, key, scopes[1])
        if slot is None:
            self._emit(SpareStarted(worker.process.pid))

    async def _watch_linked(self, key: WorkerKey) -> None:
        worker = self._linked[key].worker
        with anyio.CancelScope(shield=True):  # as WorkerGroup._watch: _stop() ends every worker
            await worker.process.watch()
        worker.ended_at = time.monotonic()
        tell: MemoryObjectSendStream[Notice] = self._tell
        tell.send_nowait(_Exit(key))

    async def _read_link(self, key: WorkerKey, scope: anyio.CancelScope) -> None:
        def heard(message: Message) -> None:
            self._tell.send_nowait(_Said(key, message))

        await self._read_lines(key, self._linked[key].link, LineDecoder(), heard, "link", scope)

    async def _read_abort_answers(self, key: WorkerKey, scope: anyio.CancelScope) -> None:
        def heard(message: AbortRequest | AbortReply) -> None:
            if isinstance(message, AbortReply):
                self._tell.send_nowait(_Answered(key, message))

        sock = self._linked[key].abort
        await self._read_lines(key, sock, AbortLines(), heard, "abort answers", scope)

    @staticmethod
    async def _read_lines(
        key: WorkerKey,
        sock: socket.socket,
        lines: Lines[_M],
        heard: Callable[[_M], None],
        what: str,
        scope: anyio.CancelScope,
    ) -> None:
        """Hand each message ``sock`` brings to ``heard`` until the worker's end closes (or
        speaks another protocol: then it is ignored)."""
        with scope:
            while True:
                await anyio.wait_readable(sock)
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    return  # the worker (and whatever inherited its end) exited
                try:
                    messages = lines.feed(data)
                except LinkProtocolError as exc:
                    logger.warning("worker %s: %s; ignoring its %s from now on", key, exc, what)
                    return
                for message in messages:
                    heard(message)
