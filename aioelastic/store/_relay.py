"""Our TCP store protocol served over any aioelastic :class:`Store` (whose keys live elsewhere).

A :class:`RelaySession` is the server's own :class:`~._tcp_session.Session` for the handshake
(and for telling a torch client by its first bytes, which then gets a torch session); after
the handshake every request is *relayed*: queued as it arrives and answered by
:meth:`RelaySession.serve`, a task of the listener, by awaiting the backing store, with the
server's own reply encoders. Waits (``get``, ``multi_get``, ``wait``, ``wait_for_change``) each
run in a task of their own, so a wait never holds up the requests behind it and a ``CANCEL``
withdraws it; every other request is answered in arrival order, one at a time, so a client that
pipelines a ``set`` and a ``get`` reads its own write.

What the backing store says travels back as the server would say it (a timeout, a value error,
a closed store). A backing store that fails otherwise (unreachable, an outcome unknown) hangs up
the client's connection: the client then knows what the relay knows, and its own rules apply
(re-send what is safe to re-send, report an unknown outcome for the rest).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from aioelastic.store._api import Store
from aioelastic.store._errors import (
    StoreClosedError,
    StoreError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._tcp_codec import Status, encode_reply
from aioelastic.store._tcp_requests import (
    Add,
    AnyRequest,
    Append,
    Auth,
    Cancel,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetPrefix,
    Hello,
    MultiGet,
    MultiSet,
    NumKeys,
    Set,
    TtlRemaining,
    Wait,
    WaitForChange,
    WaitRequest,
)
from aioelastic.store._tcp_session import HANDLERS, Session, SessionPolicy

log = logging.getLogger("aioelastic.store.tcp")

Send = Callable[[bytes], Awaitable[None]]

RELAYED: dict[type, Callable[[Store, Any], Awaitable[object]]] = {
    Set: lambda s, r: s.set(r.key, r.value, ttl=r.ttl),
    Get: lambda s, r: s.get(r.key, timeout=r.timeout),
    Add: lambda s, r: s.add(r.key, r.amount),
    CompareSet: lambda s, r: s.compare_set(r.key, r.expected, r.desired),
    Wait: lambda s, r: s.wait(r.keys, timeout=r.timeout),
    Check: lambda s, r: s.check(r.keys),
    DeleteKey: lambda s, r: s.delete_key(r.key),
    NumKeys: lambda s, r: s.num_keys(),
    MultiGet: lambda s, r: s.multi_get(r.keys, timeout=r.timeout),
    MultiSet: lambda s, r: s.multi_set(r.keys, r.values),
    Append: lambda s, r: s.append(r.key, r.value),
    GetPrefix: lambda s, r: s.get_prefix(r.prefix),
    WaitForChange: lambda s, r: s.wait_for_change(r.prefix, after=r.after, timeout=r.timeout),
    TtlRemaining: lambda s, r: s.ttl_remaining(r.key),
}
"""How each request is relayed to the backing store (its reply is the server's, from
:data:`~._tcp_session.HANDLERS`)."""

_WAITS = (Get, MultiGet, Wait, WaitForChange)


@dataclass(frozen=True, slots=True)
class RelayStatistics:
    """A snapshot of a listener's connections of our protocol (relayed to its store)."""

    connections: int
    """Connections of our protocol open now (handshake done or not)."""
    connections_total: int
    requests: int
    waiting_requests: int
    """Waits being relayed now."""
    bad_requests: int
    """Requests refused with ``BAD_REQUEST`` (the connection stayed open)."""
    store_failures: int
    """Connections hung up because the backing store failed under them."""


_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class RelaySession(Session):
    """One connection of our protocol, relayed to ``store`` (see the module docstring)."""

    def __init__(self, store: Store, peer: str, policy: SessionPolicy) -> None:
        super().__init__(peer, policy)
        self.relayed = store
        self._send_inbox, self._inbox = anyio.create_memory_object_stream[AnyRequest](math.inf)
        self._waits: dict[int, anyio.CancelScope] = {}
        self.failed: str | None = None
        """Why the backing store failed this connection, if it did."""

    @property
    def waiting(self) -> int:
        """Waits being relayed now."""
        return len(self._waits)

    def _take(self, request: AnyRequest) -> bytes | None:
        """Queue one request for :meth:`serve` (a ``CANCEL`` or a second handshake is
        answered at once)."""
        if isinstance(request, Cancel):
            if (scope := self._waits.get(request.request_id)) is not None:
                scope.cancel()
            return None
        if isinstance(request, Hello | Auth):
            return self._control(request)
        self._send_inbox.send_nowait(request)
        return None

    def close(self) -> None:
        """The connection is gone: stop relaying and withdraw its waits."""
        super().close()
        self._send_inbox.close()
        for scope in self._waits.values():
            scope.cancel()

    async def hold(self, request: WaitRequest) -> bytes:
        raise AssertionError(f"a relay parks nothing (request {request.request_id}): it relays")

    async def serve(self, send: Send, hangup: Callable[[], object]) -> None:
        """Relay the queued requests until the connection closes; ``send`` writes a reply,
        ``hangup`` closes the connection."""
        try:
            async with self._inbox, anyio.create_task_group() as waits:
                async for request in self._inbox:
                    if isinstance(request, _WAITS):
                        scope = self._waits[request.request_id] = anyio.CancelScope()
                        waits.start_soon(self._relay_wait, request, scope, send, hangup)
                        continue
                    reply = await self._relay(request)
                    if reply is None:
                        hangup()
                        return
                    await send(reply)
                waits.cancel_scope.cancel()
        except _GONE:
            pass  # the client went away: the link closes this session

    async def _relay_wait(
        self,
        request: AnyRequest,
        scope: anyio.CancelScope,
        send: Send,
        hangup: Callable[[], object],
    ) -> None:
        try:
            with scope:
                reply = await self._relay(request)
                if reply is None:
                    hangup()
                    return
                await send(reply)
        except _GONE:
            pass
        finally:
            self._waits.pop(request.request_id, None)

    async def _relay(self, request: AnyRequest) -> bytes | None:
        """The reply to ``request`` from the backing store; None if the store failed."""
        request_id = request.request_id
        try:
            result = await RELAYED[type(request)](self.relayed, request)
        except StoreTimeoutError as error:
            return encode_reply(Status.TIMEOUT, request_id, list(error.keys), error.timeout)
        except StoreValueError as error:
            return encode_reply(Status.VALUE_ERROR, request_id, str(error))
        except StoreClosedError as error:
            return encode_reply(Status.CLOSED, request_id, str(error))
        except StoreError as error:
            self.failed = f"{type(error).__name__}: {error}"
            self.report(f"the store behind this relay failed ({self.failed}); hanging up")
            return None
        except (ValueError, TypeError) as error:
            return encode_reply(Status.INVALID, request_id, str(error))
        return self._fit(request, HANDLERS[type(request)].reply(request_id, result))
