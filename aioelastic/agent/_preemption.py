"""A job-wide preemption, the agent's side: one node's notice stops every rank at one step.

Theory of operation. An agent that gets a shutdown signal (or finds ``--preemption-file``)
writes a notice to the round's store (:data:`NOTICE_KEY`: which node, which signal, the
deadline in seconds); every agent of the round waits on that key while its workers run, so
each learns it within a store round trip, and each counts the deadline from then on its own
clock (no wall clocks compared). Then, on every node:

* workers on the worker API (they said :class:`~aioelastic.worker._stop_step.Join` on the
  agent's preemption socket at their first ``world.should_stop``) are told, and agree on the
  stop step through their agents (the protocol is ``aioelastic/worker/_stop_step.py``: claims per
  node, a ready count, the closing and the stop step, all in the store);
* the other workers get the signal, as under torchrun, but on every node, not only the one
  that got it (in-place recovery's waiting spares get neither: the group's stop ends them);
* the group stops restarting and stops following the rendezvous (under in-place recovery its
  world stops changing: no generation replaces a rank that exits): it waits for every rank to
  exit, and SIGKILLs what still runs at the deadline.

The agent then ends the run as ``preempted`` (``RunState.PREEMPTED``) and says which ranks
saved at which step, which reached no step boundary in time, and how long it took.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketStream, TaskStatus

from aioelastic.agent._events import (
    AgentEvent,
    PreemptionEnded,
    PreemptionNoticed,
    RankSaved,
    StopStepAgreed,
)
from aioelastic.store import StoreError
from aioelastic.worker._protocol import LinkProtocolError
from aioelastic.worker._stop_step import (
    PREEMPT_SOCKET_ENV,
    Answer,
    Ask,
    Join,
    NodeClaims,
    Notice,
    PreemptLines,
    PreemptMessage,
    StopAt,
    Stopping,
    agreed_step,
    decode_claim,
    encode_claim,
    encode_message,
)

if TYPE_CHECKING:
    from aioelastic.agent._group import Outcome, WorkerGroup
    from aioelastic.store import Store

logger = logging.getLogger(__name__)

PREFIX = "aioelastic/preempt/"
NOTICE_KEY = f"{PREFIX}notice"
READY_KEY = f"{PREFIX}ready"
CLOSED_KEY = f"{PREFIX}closed"
STOP_KEY = f"{PREFIX}stop"
ENDED_PREFIX = f"{PREFIX}ended/"
FILE_POLL_INTERVAL = 0.5
"""How often ``--preemption-file`` is looked for (a scheduler writes it; nothing signals it)."""


def claim_key(node: int) -> str:
    """Where node ``node`` keeps the highest step any of its ranks may reach."""
    return f"{PREFIX}claim/{node}"


def ended_key(node: int) -> str:
    """Where node ``node`` leaves what its ranks did (read by ``aioelastic status``)."""
    return f"{ENDED_PREFIX}{node}"


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """The notice as the store keeps it."""

    node: int
    signal: int
    source: str
    timeout: float

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PreemptionRecord:
        data = json.loads(raw)
        node, signum, source = int(data["node"]), int(data["signal"]), str(data["source"])
        return cls(node, signum, source, float(data["timeout"]))


@dataclass(slots=True)
class _Connection:
    """One worker's connection to the preemption socket."""

    stream: SocketStream
    pid: int | None = None
    rank: int | None = None
    stopping: int | None = None
    """The step at which ``should_stop`` said True, once it did."""
    stopping_at: float | None = None
    """When it said so, on the monotonic clock."""
    asked: bool = False

    async def send(self, message: PreemptMessage) -> None:
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self.stream.send(encode_message(message))


@dataclass(slots=True)
class _Active:
    """One preemption in progress on this node."""

    record: PreemptionRecord
    store: Store
    node: int
    nodes: int
    noticed_at: float
    """When this node learned of it, on the monotonic clock (``time.monotonic()``)."""
    deadline: float
    """On anyio's clock."""
    claims: NodeClaims
    api: dict[int, _Connection] = field(default_factory=dict)
    """Pid -> connection of the local workers on the API when the notice came."""
    signalled: dict[int, int] = field(default_factory=dict)
    """Pid -> rank of the local workers the signal was forwarded to."""
    stop_step: int | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)


class Preemption:
    """An agent's part in job-wide preemptions (see the module docstring).

    :meth:`serve` runs the preemption socket in the agent's task group; :meth:`watch` is an
    attempt's outside waiter; :meth:`request` is how a signal or notice file reaches it.
    """

    def __init__(
        self,
        directory: str,
        *,
        timeout: float,
        emit: Callable[[AgentEvent], None],
        stop_node: Callable[[int], None],
    ) -> None:
        self.path = os.path.join(directory, "preempt.sock")
        self.timeout = timeout
        self._emit = emit
        self._stop_node = stop_node
        """What a signal does when the job cannot be told: stop this node (the agent's own)."""
        self._by_pid: dict[int, _Connection] = {}
        self._requested = anyio.Event()
        self._request: tuple[int, str] | None = None
        self._watching = False
        self.active: _Active | None = None

    def env(self) -> dict[str, str]:
        """What the workers are given to find the socket."""
        return {PREEMPT_SOCKET_ENV: self.path}

    @property
    def watching(self) -> bool:
        """Whether an attempt is running, so a request becomes a job-wide preemption."""
        return self._watching

    @property
    def deadline_passed(self) -> bool:
        """Whether a preemption's deadline passed on this node (what still runs is killed)."""
        active = self.active
        return active is not None and anyio.current_time() >= active.deadline

    def request(self, signum: int, source: str = "signal") -> bool:
        """Preempt the job (``signum`` is what plain workers get); False if this node asked
        already (a second signal: the caller stops at once)."""
        if self._request is not None:
            return False
        self._request = (signum, source)
        self._requested.set()
        return True

    # -- the socket --------------------------------------------------------------------------

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Accept workers' connections until cancelled."""
        listener = await anyio.create_unix_listener(self.path)
        async with listener, anyio.create_task_group() as tg:
            task_status.started()
            await listener.serve(self._connected, task_group=tg)

    async def _connected(self, stream: SocketStream) -> None:
        connection = _Connection(stream)
        lines = PreemptLines()
        async with stream:
            try:
                async for data in stream:
                    for message in lines.feed(data):
                        await self._heard(connection, message)
            except (anyio.BrokenResourceError, LinkProtocolError, OSError) as exc:
                logger.warning("preemption socket: dropped a connection: %s", exc)
            finally:
                if connection.pid is not None and self._by_pid.get(connection.pid) is connection:
                    del self._by_pid[connection.pid]
                await self._gone(connection)

    async def _heard(self, connection: _Connection, message: PreemptMessage) -> None:
        match message:
            case Join():
                connection.pid, connection.rank = message.pid, message.rank
                self._by_pid[message.pid] = connection
                active = self.active
                if active is not None and message.pid in active.api:
                    active.api[message.pid] = connection
            case Ask():
                connection.asked = True
                await connection.send(Answer(message.step, await self._ask(connection, message)))
            case Stopping():
                connection.stopping, connection.stopping_at = message.step, time.monotonic()
            case _:
                raise LinkProtocolError(f"a worker sent an agent's message: {message}")

    # -- one attempt -------------------------------------------------------------------------

    async def watch(
        self,
        waiter: Callable[[], Awaitable[tuple[Outcome, str]]],
        *,
        store: Store,
        node: int,
        nodes: int,
        group: WorkerGroup,
    ) -> tuple[Outcome, str]:
        """An attempt's outside waiter: ``waiter``'s outcome until the job is preempted; from
        then on this node's part (it returns at the deadline; the workers exiting end it
        first)."""
        from aioelastic._concurrency import first_of
        from aioelastic.agent._group import Outcome

        async def outcome() -> tuple[Outcome, str] | PreemptionRecord:
            return await waiter()

        async def noticed() -> tuple[Outcome, str] | PreemptionRecord:
            try:
                return PreemptionRecord.decode(await store.get(NOTICE_KEY, timeout=math.inf))
            except StoreError:  # the store is lost: the rendezvous's waiter says so, its way
                await anyio.sleep_forever()
                raise

        async def asked() -> tuple[Outcome, str] | PreemptionRecord:
            await self._requested.wait()
            assert self._request is not None
            signum, source = self._request
            mine = PreemptionRecord(node, signum, source, self.timeout)
            return PreemptionRecord.decode(await store.compare_set(NOTICE_KEY, "", mine.encode()))

        self._watching = True
        try:
            first = await first_of(outcome, noticed, asked)
        except StoreError as exc:  # the store went away: fall back to this node's own stop
            if self._request is None:
                raise
            logger.warning("preemption: could not tell the job (%s); stopping this node", exc)
            self._stop_node(self._request[0])
            await anyio.sleep_forever()  # the stop cancels the attempt
            raise
        finally:
            self._watching = False
        if not isinstance(first, PreemptionRecord):
            return first
        await self._take(first, store, node, nodes, group)
        return Outcome.FAILED, "the preemption deadline passed"

    async def _take(
        self, record: PreemptionRecord, store: Store, node: int, nodes: int, group: WorkerGroup
    ) -> None:
        deadline = anyio.current_time() + record.timeout
        active = self.active = _Active(
            record, store, node, nodes, time.monotonic(), deadline, NodeClaims()
        )
        group.draining = True
        bystanders = group.bystanders()
        for worker in group.workers:
            pid = worker.process.pid
            if worker.process.returncode is not None or pid in bystanders:
                continue
            connection = self._by_pid.get(pid)
            if connection is not None and connection.rank is not None:
                active.api[pid] = connection
                active.claims.waiting.add(connection.rank)
            else:
                active.signalled[pid] = worker.ranks.rank
                worker.process.signal_group(record.signal)
        self._emit(
            PreemptionNoticed(
                record.node,
                node,
                record.signal,
                record.source,
                record.timeout,
                tuple(sorted(c.rank for c in active.api.values() if c.rank is not None)),
                tuple(sorted(active.signalled.values())),
            )
        )
        for connection in active.api.values():
            await connection.send(Notice(record.node, record.timeout))
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._learn_stop_step, active)
            async with active.lock:
                await self._announce_if_ready(active)
            await anyio.sleep_until(active.deadline)
            tg.cancel_scope.cancel()

    async def _learn_stop_step(self, active: _Active) -> None:
        try:
            raw = await active.store.get(STOP_KEY, timeout=math.inf)
        except StoreError as exc:
            logger.warning("preemption: the stop step was not learned: %s", exc)
            return
        step = decode_claim(raw)
        if step is None:
            return
        active.stop_step = step
        self._emit(StopStepAgreed(step, time.monotonic() - active.noticed_at))
        for connection in active.api.values():
            await connection.send(StopAt(step))

    async def _ask(self, connection: _Connection, ask: Ask) -> int | None:
        """The answer to a rank asking to pass ``ask.step``: None (pass) or the stop step."""
        active = self.active
        if active is None or connection.rank is None:
            return None
        if active.stop_step is not None:
            return active.stop_step
        store = active.store
        try:
            async with active.lock:
                rose = active.claims.claim(connection.rank, ask.step)
                if rose is not None:
                    await store.set(claim_key(active.node), encode_claim(rose))
                await self._announce_if_ready(active)
                closed = await store.check([CLOSED_KEY])
            if not closed:
                return None
            left = max(0.0, active.deadline - anyio.current_time())
            step = decode_claim(await store.get(STOP_KEY, timeout=left))
        except StoreError as exc:  # no agreement to be had: save where it stands
            logger.warning("preemption: the job's store failed (%s); rank stops now", exc)
            return ask.step
        return ask.step if step is None else step

    async def _announce_if_ready(self, active: _Active) -> None:
        """Once every local rank on the API claimed (or left), count this node ready; the
        last node closes the claims and publishes the stop step. Called under the lock."""
        if not active.claims.ready_to_announce():
            return
        store = active.store
        try:
            await store.set(claim_key(active.node), encode_claim(active.claims.node_claim))
            if await store.add(READY_KEY, 1) < active.nodes:
                return
            await store.set(CLOSED_KEY, b"1")
            keys = [claim_key(node) for node in range(active.nodes)]
            step = agreed_step(decode_claim(raw) for raw in await store.multi_get(keys))
            await store.set(STOP_KEY, encode_claim(step))
        except StoreError as exc:
            logger.warning("preemption: could not agree on the stop step: %s", exc)

    async def _gone(self, connection: _Connection) -> None:
        active = self.active
        if active is None or connection.rank is None:
            return
        if active.api.get(connection.pid or -1) is connection:
            with anyio.CancelScope(shield=True):
                async with active.lock:
                    active.claims.gone(connection.rank)
                    await self._announce_if_ready(active)

    # -- the end -----------------------------------------------------------------------------

    async def finish(self, group: WorkerGroup) -> PreemptionEnded:
        """Emit what each rank did, leave it in the store; return the summary."""
        active = self.active
        assert active is not None
        saved: list[int] = []
        no_boundary: list[int] = []
        unsaved: list[int] = []
        for worker in group.workers:
            pid, rank = worker.process.pid, worker.ranks.rank
            connection = active.api.get(pid)
            if connection is None:
                continue
            if connection.stopping is not None and worker.process.returncode == 0:
                saved.append(rank)
                since = (worker.ended_at or time.monotonic()) - active.noticed_at
                local_rank, step = worker.ranks.local_rank, connection.stopping
                self._emit(RankSaved(rank, local_rank, pid, step, since))
            elif not connection.asked and connection.stopping is None:
                no_boundary.append(rank)
            else:
                unsaved.append(rank)
        signalled = tuple(
            (active.signalled[w.process.pid], w.process.returncode)
            for w in group.workers
            if w.process.pid in active.signalled
        )
        ends = [w.ended_at for w in group.workers if w.ended_at is not None]
        last = max(ends, default=time.monotonic()) - active.noticed_at
        told = [c.stopping_at for c in active.api.values()]
        all_stopping = None
        if told and all(at is not None for at in told):
            all_stopping = max(at for at in told if at is not None) - active.noticed_at
        ended = PreemptionEnded(
            active.stop_step,
            tuple(sorted(saved)),
            tuple(sorted(no_boundary)),
            tuple(sorted(unsaved)),
            signalled,
            max(0.0, last),
            all_stopping,
        )
        self._emit(ended)
        with anyio.move_on_after(5), suppress(StoreError):
            await active.store.set(ended_key(active.node), json.dumps(asdict(ended)).encode())
        return ended

    def reason(self, ended: PreemptionEnded) -> str:
        """The run's final line: ``preempted, saved at step S`` and what went wrong, if any."""
        active = self.active
        assert active is not None
        by = f"node {active.record.node}'s {_signal_or_file(active.record)}"
        if not active.api:
            what = "the signal was forwarded to every worker"
        elif ended.step is None:
            what = "no stop step was agreed before the deadline"
        elif ended.no_boundary or ended.unsaved:
            what = f"stopped at step {ended.step}"
        else:
            what = f"saved at step {ended.step}"
        parts = [f"preempted, {what} ({by})"]
        if ended.no_boundary:
            ranks = ", ".join(map(str, ended.no_boundary))
            parts.append(f"rank {ranks} reached no step boundary before the deadline")
        if ended.unsaved:
            parts.append(f"rank {', '.join(map(str, ended.unsaved))} did not finish saving")
        return "; ".join(parts)


def _signal_or_file(record: PreemptionRecord) -> str:
    if record.source == "file":
        return "notice file"
    with suppress(ValueError):
        return signal.Signals(record.signal).name
    return f"signal {record.signal}"


async def watch_file(path: str, preempt: Callable[[], None]) -> None:
    """Call ``preempt`` once ``path`` exists (looked for every :data:`FILE_POLL_INTERVAL` s:
    a file another program writes sends no event the standard library can wait on)."""
    while not await anyio.Path(path).exists():  # noqa: ASYNC110  (nothing to wait on)
        await anyio.sleep(FILE_POLL_INTERVAL)
    preempt()
