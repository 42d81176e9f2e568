"""The elastic rendezvous handler: a thin async shell running :mod:`._machine` over any Store.

The shell executes the machine's commands as store operations, waits with
``Store.wait_for_change`` (never a sleep loop) and reads deadlines from an injectable clock.
Besides joining, it keeps this node's liveness key fresh and, after a round completes, watches
whether the round is still valid: the next round's keys (waiting nodes, reported losses, the
close marker) and the liveness key of its ring successor, which it reports when it expires.

Fencing: each keep-alive is its own bounded attempt, so one stuck on a dead connection never
delays the next. When no renewal was acknowledged in time (:mod:`._lease`, on this node's
own clock) the round is invalidated as ``FENCED``: the node may already be taken for dead and
its ranks given to others, so its workers must stop. Joining again outlasts a store that is
unreachable for a while (a partition): a failed join is retried until no store call has
succeeded for ``read_timeout``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Self, TypeVar

import anyio
from anyio.abc import TaskGroup

from aioelastic._clock import Clock, MonotonicClock, move_on_at
from aioelastic._concurrency import Cancel, Event, LightTasks, new_event
from aioelastic._subscribers import Subscribers
from aioelastic.rendezvous import _layout as layout
from aioelastic.rendezvous import _machine as m
from aioelastic.rendezvous import _store_steps as steps
from aioelastic.rendezvous._ending import LEFT, Hosting, leave_last, worth_reading_back
from aioelastic.rendezvous._errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
    RendezvousUsageError,
)
from aioelastic.rendezvous._handler import RendezvousHandler
from aioelastic.rendezvous._info import (
    InvalidationReason,
    NodeLost,
    RendezvousEvent,
    RendezvousInfo,
    RendezvousStatistics,
    RendezvousStoreInfo,
    RoundCompleted,
    RoundInvalidated,
    RoundJoining,
)
from aioelastic.rendezvous._lease import Lease, RenewalFailures
from aioelastic.rendezvous._local import free_port as free_port  # (_static imports both)
from aioelastic.rendezvous._local import local_hostname as local_hostname
from aioelastic.rendezvous._parameters import ElasticSettings
from aioelastic.store import (
    EtcdLeaseLost,
    PrefixStore,
    Store,
    StoreError,
    StoreServerGone,
)

logger = logging.getLogger(__name__)

EventCallback = Callable[[RendezvousEvent], None]
StoreOpener = Callable[[], AbstractAsyncContextManager[Store]]
"""Opens (and on exit closes) the store a handler runs on, for backends that own their store."""

T = TypeVar("T")


class ElasticRendezvousHandler(RendezvousHandler):
    """Elastic (dynamic) rendezvous over any :class:`~aioelastic.store.Store`.

    ``store`` is either a store the caller owns, or a :data:`StoreOpener` the handler enters
    in ``__aenter__`` and leaves on exit. Keys live under ``rdzv/<run_id>/``. ``backend`` is
    the name :meth:`get_backend` reports (``c10d``, ``etcd-v3``, ``memory``, ...). Events
    (:data:`RendezvousEvent`) go to ``on_event`` and to callbacks given to :meth:`subscribe`.
    ``hosting`` says whether this node serves the store, which it then leaves last
    (:mod:`._ending`).
    """

    def __init__(
        self,
        store: Store | StoreOpener,
        settings: ElasticSettings,
        *,
        backend: str,
        local_addr: str | None = None,
        clock: Clock | None = None,
        on_event: EventCallback | None = None,
        hosting: Hosting | None = None,
    ) -> None:
        self._source = store
        self._hosting = hosting
        self._subscribers: Subscribers[RendezvousEvent] = Subscribers(
            logger, "rendezvous event", on_event
        )
        self._rounds_completed = 0
        self.settings = settings
        self._backend = backend
        self._addr = local_addr
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._policy = m.RoundPolicy(
            settings.min_nodes,
            settings.max_nodes,
            settings.join_timeout,
            settings.last_call_timeout,
        )
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._store: Store | None = None
        self._node = 0
        self._joining = False
        self._shut = False
        self._last: layout.RoundResult | None = None
        self._rank = -1
        self._invalidated: RoundInvalidated | None = None
        self._invalid_event: Event | None = None
        self._watches: LightTasks | None = None  # the keep-alive, the round's watches
        self._stop_inbox: Cancel | None = None  # cancels the round's inbox watch
        self._stop_successor: Cancel | None = None  # and its ring successor watch
        self._stop_keep_alive: Cancel | None = None  # keep-alives and the lease, a light task
        self._renewals: set[anyio.CancelScope] = set()  # each renewal in flight, in self._tg
        self._lease = Lease.for_settings(settings.heartbeat_timeout, settings.keep_alive_interval)
        self._renewal_failures = RenewalFailures()
        self._poke = new_event()  # the lease moved: set and replaced by each renewal
        self._contact = -math.inf  # when a store call last succeeded, on the clock
        self._gone: str | None = None  # the store's server is gone: what to say
        self._saw_close = False  # this node read that the run closed
        self._join_scope: anyio.CancelScope | None = None  # the join in flight

    def __repr__(self) -> str:
        return (
            f"ElasticRendezvousHandler(backend={self._backend!r}, "
            f"run_id={self.settings.run_id!r}, node={self._node})"
        )

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback`` with every later event; return a function that unsubscribes."""
        return self._subscribers.add(callback)

    def _emit(self, event: RendezvousEvent) -> None:
        self._subscribers.emit(event)

    def statistics(self) -> RendezvousStatistics:
        """Return a snapshot of this handler's state."""
        last = self._last
        return RendezvousStatistics(
            node=self._node,
            joining=self._joining,
            rounds_completed=self._rounds_completed,
            round=last.round if last is not None else 0,
            rank=self._rank,
            world_size=last.world_size if last is not None else 0,
            invalidated=self._invalidated,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RendezvousUsageError("this handler was already entered; create a new one")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            base = self._source
            if not isinstance(base, Store):
                base = await stack.enter_async_context(base())
            self._store = view = PrefixStore(f"rdzv/{self.settings.run_id}", base)
            stack.callback(self._follow_store_reports(base, view.prefix))
            if self._addr is None:
                self._addr = await anyio.to_thread.run_sync(local_hostname)
            self._node = await self._guarded(self._store.add(layout.NODE_IDS_KEY, 1))
            await self._renew()
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self._watches = LightTasks(self._tg)  # made now, not as the round completes: at
            # scale what a formation makes is promoted to the collector's oldest generation
            self._stop_keep_alive = self._watches.start(self._keep_alive)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.shutdown()
        finally:  # even when shutting down was cancelled: the task group must be left
            stack, self._stack = self._stack, None
            if stack is not None:
                if self._tg is not None:
                    self._tg.cancel_scope.cancel()
                try:
                    if self._watches is not None:
                        await self._watches.aclose()  # the round's watches, before the group
                finally:
                    await stack.aclose()

    def _require_store(self) -> Store:
        if self._store is None:
            raise RendezvousUsageError("use the handler as `async with handler:` before calling it")
        return self._store

    async def _guarded(self, call: Awaitable[T]) -> T:
        """Await a store call, turning store failures into :class:`RendezvousConnectionError`."""
        try:
            outcome = await call
        except StoreError as error:
            raise self._store_lost(error) from error
        self._contact = self._clock.now()
        return outcome

    def _store_lost(self, error: StoreError) -> RendezvousConnectionError:
        return RendezvousConnectionError(
            f"rendezvous of run {self.settings.run_id!r} lost its store: {error}"
        )

    # -- the torch API ------------------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend

    def get_run_id(self) -> str:
        return self.settings.run_id

    @property
    def node_id(self) -> int:
        """This handler's node id in the run (allocated by the store on entry)."""
        return self._node

    async def next_rendezvous(self) -> RendezvousInfo:
        store = self._require_store()
        if self._shut:
            raise RendezvousUsageError("this handler was shut down; create a new one to rejoin")
        if self._joining:
            raise RendezvousUsageError("next_rendezvous() is already running on this handler")
        self._joining = True
        self._emit(RoundJoining(self.settings.run_id, self._node))
        try:
            self._leave_round("this node left it to join the next round")
            while True:
                if self._gone is not None:
                    raise RendezvousConnectionError(self._gone)
                try:
                    with anyio.CancelScope() as self._join_scope:  # cancelled: store gone
                        command = await self._join()
                    if self._gone is None:
                        break
                    raise RendezvousConnectionError(self._gone)
                except RendezvousConnectionError as error:
                    if self._gone is not None:
                        raise RendezvousConnectionError(self._gone) from error
                    if self._clock.now() - self._contact >= self.settings.read_timeout:
                        raise
                    logger.warning(
                        "rendezvous %r: joining failed (%s); joining again",
                        self.settings.run_id,
                        error,
                    )
                    pause = min(self.settings.keep_alive_interval, self.settings.attempt_timeout)
                    await self._clock.sleep_until(self._clock.now() + pause)
        finally:
            self._joining = False
            self._join_scope = None
        if isinstance(command, m.Fail):
            if command.reason is m.FailReason.CLOSED:
                if command.round > 0:  # its join record is in the closed round
                    await self._say_read(command.round, closed=True)
                raise RendezvousClosedError(self.settings.run_id)
            raise RendezvousTimeoutError(
                self.settings.run_id,
                self.settings.join_timeout,
                command.live,
                self.settings.min_nodes,
            )
        return self._completed(store, command.result, command.rank)

    async def wait_lease_lapsed(self) -> str:
        """Return, saying why, once this node's liveness lease lapsed by its own clock (no
        renewal acknowledged in time; at once if it already has). For a caller whose workers
        run on while it joins a round (in-place recovery): it must stop them then."""
        self._require_store()
        while True:
            now = self._clock.now()
            if self._lease.lapsed(now):
                return self._lease.describe(now)
            poke = self._poke  # never set yet (the keep-alive goes on while joining)
            with move_on_at(self._clock, self._lease.fence_at):
                await poke.wait()

    async def is_closed(self) -> bool:
        store = self._require_store()
        return await self._guarded(store.check([layout.CLOSED_KEY]))

    async def set_closed(self) -> None:
        store = self._require_store()
        with anyio.fail_after(self.settings.close_timeout):
            await self._guarded(store.set(layout.CLOSED_KEY, b"1"))
            first = m.CloseRound(await self._latest() + 1)
            closed = await self._guarded(steps.compare_set_until_done(store, first))
            await self._guarded(store.add(layout.count_key(closed.round), 0))  # ring the doorbell

    async def num_nodes_waiting(self) -> int:
        return len(await self._next_round_joins())

    async def waiting_nodes(self) -> dict[int, str]:
        """The nodes that joined the next round so far (node id -> address), for progress logs."""
        joins = await self._next_round_joins()
        return {node: record.addr for node, record in sorted(layout.parse_records(joins).items())}

    async def _next_round_joins(self) -> dict[str, bytes]:
        """Joins of the round after this node's last, or after a later ``state/latest``."""
        store = self._require_store()
        round_ = max(await self._latest(), self._last.round if self._last else 0) + 1
        return (await self._guarded(store.get_prefix(layout.join_prefix(round_)))).items

    async def wait_round_invalidated(self) -> RoundInvalidated:
        self._require_store()
        if self._last is None:
            raise RendezvousUsageError(
                "no round completed on this handler yet; call next_rendezvous() first"
            )
        assert self._invalid_event is not None
        await self._invalid_event.wait()
        assert self._invalidated is not None
        return self._invalidated

    async def shutdown(self) -> bool:
        """Leave the rendezvous (a completed round learns this node left); others go on.

        The store's host leaves last: it waits, at most ``host_leave_timeout``, until every
        participant read the end (:mod:`._ending`). After a close, or once the store is gone,
        there is nothing to tidy: no store call is made."""
        if self._shut or self._store is None:
            return True
        self._shut = True
        self._stop_keeping_alive()
        store = self._store
        last, still_valid = self._last, self._invalidated is None
        self._leave_round("this handler shut down")
        clean = True
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(self.settings.close_timeout):
                if self._gone is None and last is not None and still_valid:
                    await self._report_lost(last.round + 1, self._node, LEFT)
                    still_valid = False  # told: what follows is tidying
                if self._gone is None and not self._saw_close:
                    await store.delete_key(layout.alive_key(self._node))
        except (StoreError, TimeoutError) as error:  # a warning if the others were not told
            told = self._gone is not None or last is None or not still_valid
            level, clean = (logging.INFO, True) if told else (logging.WARNING, False)
            logger.log(
                level, "rendezvous %r: leaving cleanly failed: %s", self.settings.run_id, error
            )
        if self._hosting is not None and self._hosting.here and self._gone is None:
            known = self._last.round if self._last is not None else 0
            await leave_last(
                store, self._node, known, self.settings.run_id, self._hosting, self._clock
            )
        return clean

    def _stop_keeping_alive(self) -> None:
        if self._stop_keep_alive is not None:
            self._stop_keep_alive()
        for renewal in self._renewals:
            renewal.cancel()

    async def _say_read(self, round_: int, *, closed: bool) -> None:
        """Tell the store's host this node read the end in round ``round_`` (best effort), before
        its caller learns it and may leave; after a close, keep-alives stop: the run is over."""
        if closed:
            self._saw_close = True
            self._stop_keeping_alive()
        if self._store is None or self._gone is not None:
            return
        with (
            contextlib.suppress(StoreError, TimeoutError),
            anyio.fail_after(self.settings.attempt_timeout),
        ):
            await self._store.set(layout.seen_key(round_, self._node), b"1")

    def _store_gone(self, detail: str) -> None:
        """The store's server is gone: end the round (or the join) as ``STORE_LOST`` now."""
        if self._gone is not None or self._shut:
            return
        self._gone = (
            f"rendezvous of run {self.settings.run_id!r}: the store's host was lost (it left or "
            f"died): {detail}"
        )
        self._stop_keeping_alive()
        self._leave_round(self._gone, InvalidationReason.STORE_LOST)  # (joining: left already)
        if self._join_scope is not None:
            self._join_scope.cancel()

    # -- joining ------------------------------------------------------------------------------

    async def _join(self) -> m.Finish | m.Fail:
        """One attempt to join the next round: run a fresh machine to its end."""
        assert self._addr is not None
        store = self._require_store()
        if self._lease.lapsed(self._clock.now()):
            await self._renew()  # a join must not start on a lease that lapses at once
        previous = (self._last.round, self._rank) if self._last is not None else (0, -1)
        machine = m.JoinMachine(
            self._policy,
            self._node,
            self._addr,
            free_port(self._addr),
            previous,
            read_state_on_arrival=store.counts_keys,
        )
        command = machine.start(self._clock.now())
        try:
            while not isinstance(command, m.Finish | m.Fail):
                logger.debug("rendezvous node %d: %s", self._node, command)
                try:  # as _guarded, one coroutine fewer: a waiting node holds each
                    event = await steps.execute(store, self._clock, command)
                except StoreError as error:
                    raise self._store_lost(error) from error
                now = self._contact = self._clock.now()
                logger.debug("rendezvous node %d: %s", self._node, event)
                command = machine.send(event, now)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._abandon(machine)
            raise
        return command

    async def _abandon(self, machine: m.JoinMachine) -> None:
        """Best effort after a failed or cancelled join: withdraw the join record."""
        if not machine.may_hold_join_record or self._gone is not None:
            return
        assert self._store is not None
        with (
            contextlib.suppress(StoreError, TimeoutError),
            anyio.fail_after(min(self.settings.close_timeout, self.settings.attempt_timeout)),
        ):
            await self._store.delete_key(layout.join_key(machine.round, self._node))

    async def _latest(self) -> int:
        assert self._store is not None
        snapshot = await self._guarded(self._store.get_prefix(layout.STATE_PREFIX))
        return int(snapshot.items.get(layout.LATEST_KEY, b"0"))

    def _completed(self, store: Store, result: layout.RoundResult, rank: int) -> RendezvousInfo:
        self._last, self._rank = result, rank
        self._rounds_completed += 1
        self._invalidated = None
        self._invalid_event = new_event()
        watches = self._watches
        assert watches is not None
        self._stop_inbox = watches.start(self._watch_inbox, result)
        if m.ring_successor(result.members, self._node) is not None:
            self._stop_successor = watches.start(self._watch_successor, result)
        self._emit(
            RoundCompleted(self.settings.run_id, result.round, self._node, rank, result.world_size)
        )
        if self._lease.lapsed(now := self._clock.now()):  # it lapsed while joining
            self._fence(now)
        logger.info(
            "rendezvous %r round %d complete: node %d is rank %d of %d",
            self.settings.run_id,
            result.round,
            self._node,
            rank,
            result.world_size,
        )
        return RendezvousInfo(
            store=PrefixStore(f"store/{result.round}", store),
            rank=rank,
            world_size=result.world_size,
            bootstrap_store_info=RendezvousStoreInfo(result.master_addr, result.master_port),
            round=result.round,
        )

    # -- liveness and round validity ------------------------------------------------------------

    async def _renew(self) -> None:
        """Renew this node's liveness key once; an acknowledged renewal renews the lease.

        Bounded by the lease itself: a reply after the key may have expired renews nothing.
        """
        store = self._store
        assert store is not None
        sent = self._clock.now()

        async def renew() -> bool:
            await self._guarded(
                store.set(
                    layout.alive_key(self._node),
                    layout.encode_alive(self.settings.heartbeat_timeout),
                    ttl=self.settings.heartbeat_timeout,
                )
            )
            return True

        bound = self.settings.heartbeat_timeout - self._lease.margin
        if await steps.before(self._clock, sent + bound, renew) is None:
            raise RendezvousConnectionError(
                f"rendezvous of run {self.settings.run_id!r}: the store did not acknowledge a "
                f"keep-alive within {bound:g} s"
            )
        if self._lease.lapsed(sent):  # a gap (this process was paused, say): fence first
            self._fence(sent)
        self._lease.renewed(sent)
        self._lease_moved()
        if (summary := self._renewal_failures.renewed(sent, self._clock.now())) is not None:
            logger.warning("rendezvous %r: %s", self.settings.run_id, summary)

    def _lease_moved(self) -> None:
        """Wake the lease's waiters, leaving a fresh poke for their next wait: one they found
        set would not make them wait at all (asyncio's events return at once), and a loop
        awaiting it again would hold the event loop until the lease lapsed."""
        poke, self._poke = self._poke, new_event()
        poke.set()

    async def _keep_alive(self) -> None:
        """Keep this node alive and watch its lease, in one light task (one waiting task a
        node, where thousands of nodes share a process; shutdown cancels it).

        Renew every ``keep_alive_interval``, each renewal on its own: one stuck on a dead
        connection or member does not hold back the next. Fence the current round as soon as
        the lease lapses (see :mod:`._lease`). Between the two, wait for the earlier of the
        next renewal and the lease's end, or for a poke: a renewal moved the lease. (A round
        completed on a lapsed lease is fenced as it completes, by :meth:`_completed`.)
        """
        interval, clock, tg = self.settings.keep_alive_interval, self._clock, self._tg
        assert tg is not None
        due = clock.now() + interval
        while True:
            now = clock.now()
            if now >= due:
                tg.start_soon(self._renew_logged)
                due = max(due + interval, now)
            poke = self._poke
            if self._lease.lapsed(now):
                self._fence(now)
                wake = due
            else:
                wake = min(due, self._lease.fence_at)
            with move_on_at(clock, wake):
                await poke.wait()

    async def _renew_logged(self) -> None:
        """Renew once; a failure is logged when a run of them starts (see
        :class:`RenewalFailures`), the run is summarised when it ends or fences the node."""
        if self._shut or self._saw_close or self._gone is not None:  # nothing to keep alive
            return
        sent = self._clock.now()
        scope = anyio.CancelScope()  # shutdown cancels the renewals in flight
        self._renewals.add(scope)
        try:
            with scope:
                await self._renew()
        except RendezvousError as error:
            line = self._renewal_failures.failed(sent, self._clock.now(), str(error))
            if line is not None:
                logger.warning("rendezvous %r: %s", self.settings.run_id, line)
        finally:
            self._renewals.discard(scope)

    def _follow_store_reports(self, store: Store, prefix: str) -> Callable[[], None]:
        """Fence as soon as ``store`` reports this node's liveness lease lost (an etcd store
        finds it at the next renewal: revoked, or expired before this node's clock says so),
        as if the lease had lapsed; ``prefix`` is this handler's in ``store``. End the round
        as ``STORE_LOST`` as soon as it reports its server gone (a TCP store whose every
        reconnection was refused). Returns the unsubscribe function."""
        subscribe = getattr(store, "subscribe", None)
        if subscribe is None:
            return lambda: None

        def on_event(event: object) -> None:
            alive = f"{prefix}/{layout.alive_key(self._node)}"
            if isinstance(event, EtcdLeaseLost) and event.key == alive:
                self._fence(self._clock.now(), f"the store lost its liveness lease: {event.detail}")
            elif isinstance(event, StoreServerGone):
                self._store_gone(event.detail)

        unsubscribe: Callable[[], None] = subscribe(on_event)
        return unsubscribe

    def _fence(self, now: float, why: str | None = None) -> None:
        """Invalidate the current round as FENCED (if one is running): the lease lapsed."""
        if self._last is not None and self._invalidated is None and not self._joining:
            reason = why if why is not None else self._lease.describe(now)
            detail = f"round {self._last.round} fenced: {reason}"
            failing = self._renewal_failures.summary(now)
            logger.warning(
                "rendezvous %r: %s%s",
                self.settings.run_id,
                detail,
                f"; {failing}" if failing else "",
            )
            self._invalidate(RoundInvalidated(InvalidationReason.FENCED, detail))

    def _invalidate(self, verdict: RoundInvalidated) -> None:
        if self._invalidated is None:
            self._invalidated = verdict
            if self._invalid_event is not None:
                self._invalid_event.set()
            self._emit(verdict)
            logger.info("rendezvous %r: %s", self.settings.run_id, verdict.detail)

    def _leave_round(
        self, why: str, reason: InvalidationReason = InvalidationReason.NODES_WAITING
    ) -> None:
        """Stop watching the last round; waiters learn it is no longer valid for this node."""
        for stop in (self._stop_inbox, self._stop_successor):
            if stop is not None:
                stop()
        self._stop_inbox = self._stop_successor = None
        if self._last is not None:
            self._invalidate(RoundInvalidated(reason, why))

    async def _watch_again(self, result: layout.RoundResult, error: StoreError) -> bool:
        """After one of the round's watches failed on the store: pause, and say whether to
        watch again.

        Each watch (its inbox, its ring successor) is a light task of its own, so neither
        holds the other back, and retries itself: a wrapper coroutine doing it would hold two
        objects more a node while every node waits. A store failure is no verdict: the watch
        starts again while the lease holds (a blip costs the world nothing), and once the
        lease lapses :meth:`_keep_alive` fences the round, which stops the workers before
        anyone may take their ranks (False: stop).
        """
        if self._lease.lapsed(self._clock.now()) or self._gone is not None:
            return False
        logger.warning(
            "rendezvous %r: watching round %d failed (%s); watching again while the lease holds",
            self.settings.run_id,
            result.round,
            error,
        )
        pause = min(self.settings.keep_alive_interval, self.settings.attempt_timeout)
        await self._clock.sleep_until(self._clock.now() + pause)
        return True

    async def _watch_inbox(self, result: layout.RoundResult) -> None:
        """Return once the next round's keys say this round is over (and say so)."""
        store = self._store
        assert store is not None
        while True:
            try:
                verdict, inbox = await steps.inbox_verdict(store, result)
                break
            except StoreError as error:
                if not await self._watch_again(result, error):
                    return
        if self._stop_successor is not None:  # the inbox decides: the round is over
            self._stop_successor()
        if worth_reading_back(verdict, inbox, result.round + 1):
            closed = verdict.reason is InvalidationReason.CLOSED
            await self._say_read(result.round + 1, closed=closed)
        self._invalidate(verdict)

    async def _watch_successor(self, result: layout.RoundResult) -> None:
        """Report the ring successor lost once its liveness key is gone, or once this node has
        seen no renewal of it for ``heartbeat_timeout`` (by its own clock) and a fresh read
        confirms none came: a store may keep the key longer than its TTL (etcd may refresh
        leases when a new leader is promoted)."""
        store = self._store
        assert store is not None
        successor = m.ring_successor(result.members, self._node)
        assert successor is not None
        timeout = self.settings.heartbeat_timeout
        told = False
        while True:
            try:
                await steps.successor_gone(store, self._clock, successor, timeout)
                # Told first (once, though a failed report is tried again): once the report is
                # in, the inbox watch may end the round and stop this watch before the report's
                # own calls return.
                if not told:
                    self._emit(NodeLost(self.settings.run_id, result.round, successor))
                    told = True
                await self._report_lost(result.round + 1, successor, "heartbeat expired")
                return
            except StoreError as error:
                if not await self._watch_again(result, error):
                    return

    async def _report_lost(self, inbox: int, node: int, why: str) -> None:
        """Report ``node`` gone in the inbox round ``inbox`` and ring its doorbell."""
        assert self._store is not None
        await self._store.set(layout.lost_key(inbox, node), why)
        await self._store.add(layout.count_key(inbox), 0)
