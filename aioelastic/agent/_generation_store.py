"""Where a job's world lives: the log a replica is fed from, and the stores of its generations.

Two transports, one interface, so the in-place group is one machine on one node as across
many (``_recovery.py``):

* :class:`OwnLog`, one node: the log is this agent's memory, and an entry is fed the moment it
  is made; the generations' stores are prefixes of a store the attempt serves on loopback
  (:class:`~aioelastic.store.TCPStoreServer`, torch's ``TCPStore`` protocol and ours on one
  port), so no worker binds a port and no worker's death takes the store away.
* :class:`JobLog`, many nodes: the log is in the job's store, under its epoch; what this agent
  saw is appended (compare-and-set on the next free index: an entry is whole or absent, whoever
  races for it) and every entry is read back in order, waiting on the store for the next one
  (a push: no agent polls). The generations' stores are in the job's store too, served to this
  node's workers on loopback, so workers of every node meet in them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioelastic.agent._generation_log import (
    Begin,
    GenerationLogError,
    LogEntry,
    decode_entry,
    encode_entry,
)
from aioelastic.agent._generation_types import Event
from aioelastic.store import PrefixStore, Store, StoreError, TCPStoreServer, TorchStoreListener

logger = logging.getLogger("aioelastic.agent._recovery")

LOG_RETRY_PAUSE = 0.5
"""After a failed store call on the generation log, the pause before trying again (the
rendezvous fences this node if its store stays away)."""


class OwnLog:
    """One node's world: its log in memory, its generations' stores on loopback."""

    replicated = False

    def __init__(self, begin: Begin, restart_count: int) -> None:
        self._begin = begin
        self._restart_count = restart_count
        self._serial = 0
        self._server: TCPStoreServer | None = None

    @asynccontextmanager
    async def serving(self, heard: Callable[[LogEntry], None]) -> AsyncIterator[Begin]:
        """Serve the generations' stores while the attempt runs; the log's first entry."""
        async with TCPStoreServer("127.0.0.1", 0) as self._server:
            yield self._begin

    async def follow(self) -> None:
        """Nothing to follow: every entry is fed as it is made."""
        await anyio.sleep_forever()

    def append(self, event: Event, pid: int | None) -> LogEntry | None:
        """The entry to feed now."""
        self._serial += 1
        return LogEntry(event, "", self._serial, pid)

    async def append_now(self, event: Event) -> None:
        """Nobody else reads this log: a node that stops need not say so."""

    def world_store(self, generation: int) -> dict[str, Any]:
        """Where generation ``generation``'s store is, as a worker opens it."""
        assert self._server is not None
        return {
            "kind": "tcp",
            "host": self._server.host,
            "port": self._server.port,
            "prefix": f"aioelastic/{self._restart_count}/gen{generation}",
        }


class JobLog:
    """The world of a job over many nodes: its log and its generations' stores in the job's
    store, under one epoch (see the module docstring)."""

    replicated = True

    def __init__(
        self,
        job: Store,
        epoch: int,
        token: str,
        *,
        begin: Begin | None,
        read_timeout: float,
    ) -> None:
        self._scope = PrefixStore(f"aioelastic/inplace/{epoch}", job)
        self._log = PrefixStore("log", self._scope)
        self._token = token
        self._begin = begin
        """The log's first entry to write (beginning an epoch), or None (joining one)."""
        self._read_timeout = read_timeout
        self._serial = 0
        self._next = 0
        """The index of the next entry to read."""
        self._append_at = 0
        """The lowest index this agent may append at (past its own last entry)."""
        self._to_append: MemoryObjectSendStream[tuple[Event, int | None]]
        self._appends: MemoryObjectReceiveStream[tuple[Event, int | None]]
        self._to_append, self._appends = anyio.create_memory_object_stream[
            tuple[Event, int | None]
        ](math.inf)
        self._heard: Callable[[LogEntry], None] | None = None
        self._listener: TorchStoreListener | None = None

    @asynccontextmanager
    async def serving(self, heard: Callable[[LogEntry], None]) -> AsyncIterator[Begin]:
        """Serve the generations' stores to this node's workers while the attempt runs, the
        log open; ``heard`` gets each entry read back (once :meth:`follow` runs)."""
        self._heard = heard
        with self._to_append, self._appends:
            worlds = TorchStoreListener(PrefixStore("worlds", self._scope), native=True)
            async with worlds as self._listener:
                yield await self._open()

    async def _open(self) -> Begin:
        """Begin the epoch's log, or read its beginning (joining)."""
        if self._begin is not None:
            raw = encode_entry(LogEntry(self._begin))
            stored = await self._log.compare_set("0", b"", raw)
        else:
            stored = await self._log.get("0", timeout=self._read_timeout)
        first = decode_entry(stored).event
        if not isinstance(first, Begin):
            raise GenerationLogError(stored, "the log of an epoch must begin with Begin")
        self._next = self._append_at = 1
        return first

    async def follow(self) -> None:
        """Append what this node saw and read every entry back, in order, until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._append_each)
            await self._read_each()

    def append(self, event: Event, pid: int | None) -> LogEntry | None:
        """Queue ``event`` for the log: what it means comes back through the log, in order."""
        self._to_append.send_nowait((event, pid))
        return None

    async def _append_each(self) -> None:
        async for event, pid in self._appends:
            raw = encode_entry(LogEntry(event, self._token, self._serial, pid))
            self._serial += 1
            index = max(self._next, self._append_at)
            while True:
                try:
                    stored = await self._log.compare_set(str(index), b"", raw)
                except StoreError as exc:
                    logger.warning("generation log: appending failed (%s); trying again", exc)
                    await anyio.sleep(LOG_RETRY_PAUSE)
                    continue
                index += 1
                if stored == raw:
                    break
            self._append_at = index

    async def append_now(self, event: Event) -> None:
        """Append ``event`` at once, past whatever is queued (the appender task may be gone)."""
        raw = encode_entry(LogEntry(event, self._token, self._serial))
        self._serial += 1
        index = max(self._next, self._append_at)
        while True:
            try:
                stored = await self._log.compare_set(str(index), b"", raw)
            except StoreError as exc:
                logger.info("could not log this node's leaving: %s", exc)
                return
            index += 1
            if stored == raw:
                self._append_at = index
                return

    async def _read_each(self) -> None:
        """Read the log in order, waiting on the store for each next entry."""
        assert self._heard is not None
        while True:
            try:
                raw = await self._log.get(str(self._next), timeout=math.inf)
            except StoreError as exc:
                logger.warning("generation log: reading failed (%s); reading again", exc)
                await anyio.sleep(LOG_RETRY_PAUSE)
                continue
            self._next += 1
            try:
                entry = decode_entry(raw)
            except GenerationLogError as exc:  # every replica skips it alike
                logger.warning("generation log entry %d skipped: %s", self._next - 1, exc)
                continue
            self._heard(entry)

    def world_store(self, generation: int) -> dict[str, Any]:
        """Where generation ``generation``'s store is, as a worker opens it."""
        assert self._listener is not None
        return {
            "kind": "tcp",
            "host": self._listener.host,
            "port": self._listener.port,
            "prefix": f"gen{generation}",
        }
