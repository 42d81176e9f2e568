"""etcd leases for :class:`~aioelastic.store.EtcdStore`: the session lease and its marker slots,
and the leases of TTL keys.

The session lease carries the markers of the exactly-once updates (:mod:`._etcd_txn`); the
store's task group renews it every third of its TTL. When it is found expired, it is reported
(writes in flight on it cannot be checked any more) and a new one is granted. A TTL key has a
lease of its own, granted with the TTL rounded up to whole seconds and renewed when the key is
written again with the same TTL.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import anyio

from aioelastic.store._errors import StoreConnectionError, StoreError
from aioelastic.store._etcd_rpc import (
    EtcdConnection,
    Member,
    describe,
    grpc,
    is_not_found,
    is_rpc_error,
    rpc,
    settle,
)

logger = logging.getLogger("aioelastic.store._etcd")


async def grant(conn: EtcdConnection, seconds: int) -> int:
    """Grant a lease of ``seconds`` (with an id of our choosing, so a retry is idempotent)."""
    lease_id = random.getrandbits(62) or 1
    attempts = 0

    async def attempt(member: Member, timeout: float) -> None:
        nonlocal attempts
        attempts += 1
        try:
            await member.lease.LeaseGrant(
                rpc.LeaseGrantRequest(ID=lease_id, TTL=seconds),
                timeout=timeout,
                metadata=member.metadata,
            )
        except Exception as error:
            # A retry finding the lease means an earlier attempt was granted.
            if attempts > 1 and "lease already exists" in describe(error):
                return
            raise

    await conn.call("grant lease", attempt)
    return lease_id


async def keepalive(conn: EtcdConnection, lease_id: int) -> int:
    """Renew ``lease_id``; return its TTL now (0 when the lease no longer exists)."""

    async def attempt(member: Member, timeout: float) -> int:
        call = member.lease.LeaseKeepAlive(metadata=member.metadata, timeout=timeout)
        try:
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
            response = await call.read()
        finally:
            call.cancel()
        if response is grpc.aio.EOF:
            raise StoreConnectionError(member.address, "lease keepalive stream ended")
        ttl: int = response.TTL
        return ttl

    return await conn.call("renew lease", attempt)


async def time_to_live(conn: EtcdConnection, lease_id: int) -> int | None:
    """The remaining TTL of ``lease_id`` in whole seconds (None: it no longer exists)."""
    request = rpc.LeaseTimeToLiveRequest(ID=lease_id)

    async def attempt(member: Member, timeout: float) -> int:
        response = await member.lease.LeaseTimeToLive(
            request, timeout=timeout, metadata=member.metadata
        )
        ttl: int = response.TTL
        return ttl

    try:
        ttl = await conn.call("read lease time to live", attempt)
    except Exception as error:
        if is_not_found(error):
            return None  # the lease expired since the key was read
        raise
    return None if ttl < 0 else ttl


class Session:
    """The store's session lease and the marker slots attached to it.

    A slot is used by one update at a time; ``revisions`` holds the mod revision of each slot's
    marker key (0 while it has none). A slot whose update failed or was cancelled is retired
    (never given back): a transaction of it may still land.
    """

    def __init__(self, lease: int) -> None:
        self.lease = lease
        self.revisions: dict[int, int] = {}
        self._free: list[int] = []

    def take_slot(self) -> int:
        """A slot no update is using."""
        slot = self._free.pop() if self._free else len(self.revisions)
        self.revisions.setdefault(slot, 0)
        return slot

    def give_back(self, slot: int, marker_revision: int) -> None:
        """Return ``slot`` after an update that finished, with its marker's revision now."""
        self.revisions[slot] = marker_revision
        self._free.append(slot)

    def marker(self, ops_prefix: bytes, slot: int) -> bytes:
        """The marker key of ``slot``."""
        return ops_prefix + f"{self.lease:x}/{slot}".encode()


class SessionLease:
    """The current :class:`Session` (None while there is none), renewed and replaced.

    ``on_lost(lease_id)`` is called when the session lease is found expired.
    """

    def __init__(self, conn: EtcdConnection, ttl: int, on_lost: Callable[[int], None]) -> None:
        self._conn = conn
        self.ttl = ttl
        self._on_lost = on_lost
        self.current: Session | None = None
        self._lock = anyio.Lock()

    async def start(self) -> Session:
        """Grant a new session lease and make it current."""
        self.current = Session(await grant(self._conn, self.ttl))
        return self.current

    async def ensure(self) -> Session:
        """The current session, granting one if there is none."""
        while self.current is None:
            async with self._lock:
                if self.current is None:
                    await self.start()
        return self.current

    async def renew(self, seen: Session | None) -> None:
        """Renew ``seen``; when it is gone, report it and start a new session.

        Does nothing if another task already replaced ``seen``.
        """
        async with self._lock:
            if self.current is not seen:
                return
            try:
                if seen is not None and await keepalive(self._conn, seen.lease) > 0:
                    return
            except StoreError as error:
                logger.warning("cannot renew the etcd session lease: %s", error)
                return
            self.current = None
            if seen is not None:
                self._on_lost(seen.lease)
            try:
                await self.start()
            except StoreError as error:
                logger.warning("cannot start a new etcd session: %s", error)

    async def revoke(self) -> None:
        """Revoke the session lease (best effort: one attempt; otherwise it expires)."""
        session, self.current = self.current, None
        if session is None:
            return
        member = self._conn.current
        try:
            await settle(
                member.lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=session.lease),
                    timeout=self._conn.request_timeout,
                    metadata=member.metadata,
                )
            )
        except Exception as error:
            if not is_rpc_error(error):
                raise
            logger.info("etcd session lease %x not revoked (%s); it expires", session.lease, error)


class TTLLeases:
    """The lease of each TTL key this store wrote: ``key -> (lease id, seconds)``."""

    def __init__(self, conn: EtcdConnection) -> None:
        self._conn = conn
        self._leases: dict[bytes, tuple[int, int]] = {}
        self._replacing: dict[bytes, anyio.Lock] = {}  # per key, while a lost lease is replaced

    def __len__(self) -> int:
        return len(self._leases)

    def forget(self, key: bytes) -> None:
        """``key`` was written without a TTL (or deleted): it has no lease of ours any more."""
        self._leases.pop(key, None)
        self._replacing.pop(key, None)

    async def lease_for(self, key: bytes, seconds: int, on_lost: Callable[[int], None]) -> int:
        """The lease to write ``key`` with: its own renewed, or a new one.

        ``on_lost(lease_id)`` is called once when the key's lease had expired before this
        write: concurrent writes that find the same lease gone share one new lease.
        """
        lease = self._leases.get(key)
        if lease is not None and lease[1] == seconds:
            if await keepalive(self._conn, lease[0]) > 0:
                return lease[0]
            async with self._replacing.setdefault(key, anyio.Lock()):
                now = self._leases.get(key)
                if now is not lease and now is not None and now[1] == seconds:
                    return now[0]  # another write replaced it meanwhile
                on_lost(lease[0])
                return await self.replace(key, seconds)
        return await self.replace(key, seconds)

    async def replace(self, key: bytes, seconds: int) -> int:
        """Grant a new lease for ``key`` and remember it."""
        lease_id = await grant(self._conn, seconds)
        self._leases[key] = (lease_id, seconds)
        return lease_id
