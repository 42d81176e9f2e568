"""One TCP store connection's protocol state on the server, without I/O: bytes in, replies out.

Theory of operation. A :class:`Session` moves through :class:`Phase` ``PREAMBLE`` -> ``HELLO``
(-> ``AUTH`` when the server has a token) -> ``OPEN``, and ``CLOSED`` once the connection is
gone. :meth:`Session.receive` takes whatever bytes arrived and returns the replies to send now;
the shell writes them, and closes the connection once :attr:`Session.closing` is set (after a
refusal, or input that cannot be trusted). An open session answers each request through one
table, :data:`HANDLERS`, keyed by the request's class (:mod:`._tcp_requests`): every entry
computes a result from the store without waiting, and turns it into a reply. A request that
must wait (a ``get`` of a missing key, a ``wait_for_change`` with nothing new) gets no reply:
its entry answers :data:`PARK`, the session puts the request in :attr:`Session.parked`, and the
shell holds it (:func:`hold`, the entry's awaiting half) and sends what
:meth:`Session.settle` makes of the outcome. A ``CANCEL`` of a held wait puts its id in
:attr:`Session.withdrawn` for the shell to cancel. A torch client's first bytes end the
handshake at once with :attr:`Session.torch_bytes` set: the shell hands the connection to a
torch session (:mod:`._torch_session`).

A :class:`Session` is the handshake and the framing; what an open session does with a request is
its subclass's: a :class:`StoreSession` answers from the server's own :class:`MemoryStore`, a
relay (:class:`~._relay.RelaySession`) hands it to a store elsewhere. The session spawns
nothing and holds no counter of the server's: it counts in its own fields
(:class:`SessionCounts`), which the server adds up.
"""

from __future__ import annotations

import abc
import enum
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aioelastic.store._api import Snapshot
from aioelastic.store._auth import NONCE_SIZE, check_proof, new_nonce, proof
from aioelastic.store._errors import (
    StoreClosedError,
    StoreProtocolError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._memory import MemoryStore
from aioelastic.store._peers import OncePerPeer
from aioelastic.store._tcp_codec import (
    PREAMBLE_SIZE,
    VERSION,
    FrameReader,
    Status,
    decode_preamble,
    encode_reply,
    reply_encoder,
)
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
    read_request,
)
from aioelastic.store._tls import tls_failure
from aioelastic.store._torch_codec import looks_like_torch

log = logging.getLogger("aioelastic.store.tcp")

HANDSHAKE_FRAME_LIMIT = 1024
"""The largest frame body read before a client is authenticated."""


class Phase(enum.Enum):
    PREAMBLE = "preamble"
    HELLO = "hello"
    AUTH = "auth"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    """What every session of one server shares: its identity, limits and credentials."""

    epoch: int
    max_frame_size: int
    handshake_timeout: float
    token: bytes | None
    torch_clients: bool
    unauthenticated: OncePerPeer
    """Hosts already warned about before a handshake (one warning per host)."""


@dataclass(slots=True)
class SessionCounts:
    """What one session counted (the server adds these up in its statistics)."""

    requests: int = 0
    bad_requests: int = 0
    dropped: int = 0
    refused: int = 0

    def add(self, other: SessionCounts) -> None:
        """Add ``other``'s counts to these."""
        self.requests += other.requests
        self.bad_requests += other.bad_requests
        self.dropped += other.dropped
        self.refused += other.refused


class _Park:
    """The result of a request that must wait: the shell holds it."""


PARK = _Park()

R = TypeVar("R")


@dataclass(frozen=True)
class Handler(Generic[R]):
    """How one kind of request is answered: at once from the store, and if it must wait,
    by awaiting the store (only waits have ``wait``, and only their ``answer`` parks)."""

    answer: Callable[[MemoryStore, R], object]
    """The result now, or :data:`PARK`."""
    reply: Callable[[int, Any], bytes]
    """Encode a result as the reply to the request with this id."""
    wait: Callable[[MemoryStore, R], Awaitable[object]] | None = None


_ok_reply = reply_encoder(Status.OK)


def _ok(request_id: int, _: object) -> bytes:
    return _ok_reply(request_id)


def _snapshot(request_id: int, snapshot: Snapshot) -> bytes:
    items = snapshot.items
    return encode_reply(
        Status.SNAPSHOT, request_id, snapshot.revision, list(items), list(items.values())
    )


_bytes = reply_encoder(Status.BYTES)
_int = reply_encoder(Status.INT)
_bool = reply_encoder(Status.BOOL)
_values = reply_encoder(Status.VALUES)
_seconds = reply_encoder(Status.SECONDS)


def _get_now(store: MemoryStore, request: Get) -> object:
    values = store.get_nowait((request.key,))
    return PARK if values is None else values[0]


def _multi_get_now(store: MemoryStore, request: MultiGet) -> object:
    values = store.get_nowait(request.keys)
    return PARK if values is None else values


HANDLERS: dict[type, Handler[Any]] = {
    Set: Handler[Set](lambda s, r: s.set_nowait(r.key, r.value, ttl=r.ttl), _ok),
    Add: Handler[Add](lambda s, r: s.add_nowait(r.key, r.amount), _int),
    CompareSet: Handler[CompareSet](
        lambda s, r: s.compare_set_nowait(r.key, r.expected, r.desired), _bytes
    ),
    Check: Handler[Check](lambda s, r: s.check_nowait(r.keys), _bool),
    DeleteKey: Handler[DeleteKey](lambda s, r: s.delete_nowait(r.key), _bool),
    NumKeys: Handler[NumKeys](lambda s, r: s.num_keys_nowait(), _int),
    MultiSet: Handler[MultiSet](lambda s, r: s.multi_set_nowait(r.keys, r.values), _ok),
    Append: Handler[Append](lambda s, r: s.append_nowait(r.key, r.value), _ok),
    TtlRemaining: Handler[TtlRemaining](lambda s, r: s.ttl_remaining_nowait(r.key), _seconds),
    GetPrefix: Handler[GetPrefix](lambda s, r: s.get_prefix_nowait(r.prefix), _snapshot),
    Get: Handler[Get](_get_now, _bytes, lambda s, r: s.get(r.key, timeout=r.timeout)),
    MultiGet: Handler[MultiGet](
        _multi_get_now, _values, lambda s, r: s.multi_get(r.keys, timeout=r.timeout)
    ),
    Wait: Handler[Wait](
        lambda s, r: None if s.check_nowait(r.keys) else PARK,
        _ok,
        lambda s, r: s.wait(r.keys, timeout=r.timeout),
    ),
    WaitForChange: Handler[WaitForChange](
        lambda s, r: s.revision if s.changed_since(r.prefix, r.after) else PARK,
        _int,
        lambda s, r: s.wait_for_change(r.prefix, after=r.after, timeout=r.timeout),
    ),
}
"""How each request class is answered (``CANCEL``, ``HELLO`` and ``AUTH`` are the session's)."""


async def hold(store: MemoryStore, request: WaitRequest) -> bytes:
    """Wait in the store for what a parked ``request`` waits on; return its reply (a
    ``TIMEOUT`` or ``CLOSED`` reply when it ends that way). The shell's half of a park."""
    handler = HANDLERS[type(request)]
    assert handler.wait is not None
    request_id = request.request_id
    try:
        result = await handler.wait(store, request)
    except StoreTimeoutError as error:
        return encode_reply(Status.TIMEOUT, request_id, list(error.keys), error.timeout)
    except StoreClosedError as error:
        return encode_reply(Status.CLOSED, request_id, str(error))
    return handler.reply(request_id, result)


class Session(abc.ABC):
    """One connection's protocol state, without I/O: bytes in (:meth:`receive`), replies out.

    The handshake (preamble, version, token) comes first; then each request goes to
    :meth:`_answer`, which answers it at once or parks it for the shell (see the module
    docstring).
    """

    def __init__(self, peer: str, policy: SessionPolicy) -> None:
        self.peer = peer
        self.policy = policy
        self.phase = Phase.PREAMBLE
        self.closing = False
        self.counts = SessionCounts()
        self.pending = b""  # handshake bytes not yet answered
        self.reader = FrameReader(policy.max_frame_size)
        self.limit = policy.max_frame_size
        self.client_nonce = self.server_nonce = b""
        self.parked: list[WaitRequest] = []
        """Waits to hold, taken by the shell."""
        self.withdrawn: list[int] = []
        """Ids of held waits the client cancelled, taken by the shell."""
        self.torch_bytes: bytes | None = None
        """A torch client's first bytes, once the session found it is one."""
        self._held: set[int] = set()
        self.reported = False

    @property
    def open(self) -> bool:
        """Whether the handshake is done (and the connection not closed)."""
        return self.phase is Phase.OPEN

    def report(self, reason: str) -> None:
        """Log a problem with this client: the first as a warning, the rest at debug level.

        Before the handshake is done only a host's first problem is a warning, so a host that
        keeps knocking with no or a wrong token, or with garbage, cannot flood the log.
        """
        first = not self.reported and (
            self.phase is Phase.OPEN or self.policy.unauthenticated.first(self.peer)
        )
        self.reported = True
        if first and self.phase is not Phase.OPEN:
            reason += " (further problems from this host before a handshake: debug level)"
        log.log(
            logging.WARNING if first else logging.DEBUG, "store client %s: %s", self.peer, reason
        )

    def close(self) -> None:
        """The connection is gone: nothing more is answered."""
        self.phase = Phase.CLOSED
        self._held.clear()

    def expire_handshake(self) -> None:
        """The handshake took longer than the policy allows: count and report it."""
        self.counts.dropped += 1
        self.report(
            f"no handshake within {self.policy.handshake_timeout:g} s; closing the connection"
        )

    def refuse_tls(self, error: BaseException) -> bytes:
        """The TLS handshake failed: count and report the refusal (no request was read);
        return the ``REFUSED`` reply, for a client that speaks in clear."""
        return self._refuse(f"TLS handshake failed: {tls_failure(error)}")

    def settle(self, request: WaitRequest, reply: bytes | None) -> bytes | None:
        """A held wait ended with ``reply`` (None if it was cancelled): return what to send,
        None if nothing (cancelled, or the connection is gone)."""
        self._held.discard(request.request_id)
        if reply is None or self.phase is not Phase.OPEN:
            return None
        return self._fit(request, reply)

    def _drop(self, reason: str) -> None:
        self.counts.dropped += 1
        self.report(f"{reason}; closing the connection")
        self.closing = True

    def _refuse(self, reason: str) -> bytes:
        self.counts.refused += 1
        self.report(f"refused: {reason}")
        self.closing = True
        return encode_reply(Status.REFUSED, 0, reason)

    def receive(self, data: bytes) -> bytes:
        """Take received bytes; return the replies to send now (maybe empty)."""
        if self.phase is Phase.OPEN and not self.closing and self.torch_bytes is None:
            return self._requests(data)  # (checked first: every request of a client is here)
        if self.closing or self.phase is Phase.CLOSED or self.torch_bytes is not None:
            return b""
        if self.phase is Phase.PREAMBLE and not self.pending and looks_like_torch(data):
            if not self.policy.torch_clients:
                self._refuse(
                    "a torch TCPStore client, which cannot send this server's token; serve "
                    "torch clients on a server without a token, or through the agent's "
                    "loopback listener"
                )
            else:
                self.torch_bytes = data
                self.phase = Phase.OPEN
            return b""
        if self.phase is not Phase.OPEN:
            handshake, data = self._handshake(data)
            return handshake + self._requests(data) if data else handshake
        return self._requests(data)

    # -- the handshake ----------------------------------------------------------------------

    def _handshake(self, data: bytes) -> tuple[bytes, bytes]:
        """Answer the handshake frames in ``data``; return the replies and the bytes after it.

        Frames are split here, one at a time and at most :data:`HANDSHAKE_FRAME_LIMIT` bytes
        each, so an unauthenticated peer cannot make the server buffer a large frame, and the
        requests a client sends right behind its ``HELLO`` are read under the full limit.
        """
        pending = self.pending = self.pending + data
        replies: list[bytes] = []
        while not self.closing:
            if self.phase is Phase.OPEN:
                self.pending = b""
                return b"".join(replies), pending
            if self.phase is Phase.PREAMBLE:
                if len(pending) < PREAMBLE_SIZE:
                    break
                if (refusal := self._check_preamble(pending[:PREAMBLE_SIZE])) is not None:
                    replies.append(refusal)
                    break
                pending = pending[PREAMBLE_SIZE:]
                self.phase = Phase.HELLO
                continue
            if len(pending) < 4:
                break
            size = int.from_bytes(pending[:4], "big")
            if size > HANDSHAKE_FRAME_LIMIT:
                self._drop(
                    f"a handshake frame of {size} bytes, above the {HANDSHAKE_FRAME_LIMIT}-byte "
                    "limit"
                )
                break
            if len(pending) < 4 + size:
                break
            body, pending = pending[4 : 4 + size], pending[4 + size :]
            replies.append(self._hello(body))
        self.pending = pending
        return b"".join(replies), b""

    def _check_preamble(self, preamble: bytes) -> bytes | None:
        """Return the refusal of a preamble (or drop the connection), None if it is ours."""
        try:
            version = decode_preamble(preamble)
        except StoreProtocolError as error:
            self._drop(error.reason)
            return b""
        if version != VERSION:
            return self._refuse(
                f"the client speaks store protocol version {version}, the server {VERSION}; "
                "use the same aioelastic version on both ends"
            )
        return None

    def _hello(self, body: bytes) -> bytes:
        """Answer a handshake frame: ``HELLO``, then ``AUTH`` when the server has a token."""
        try:
            frame = read_request(body)
        except StoreProtocolError as error:
            self._drop(f"bad handshake frame: {error.reason}")
            return b""
        expected = Hello if self.phase is Phase.HELLO else Auth
        if not isinstance(frame, expected):
            return self._refuse(
                f"expected {expected.op.name} in the handshake, not {frame.op.name}"
            )
        token = self.policy.token
        if token is None:
            return self._welcome(frame.request_id, b"")
        if isinstance(frame, Hello):
            if not frame.nonce:
                return self._refuse(
                    "this server requires a token; give the client the server's token "
                    "(TCPStore(token=...), --rdzv-conf token_file=PATH)"
                )
            if len(frame.nonce) != NONCE_SIZE:
                return self._refuse(f"a HELLO nonce must be {NONCE_SIZE} bytes")
            self.client_nonce, self.server_nonce = frame.nonce, new_nonce()
            self.phase = Phase.AUTH
            return encode_reply(Status.CHALLENGE, frame.request_id, self.server_nonce)
        assert isinstance(frame, Auth)
        if not check_proof(token, "client", self.client_nonce, self.server_nonce, frame.proof):
            return self._refuse(
                "the token does not match the server's; use the same token file on every node"
            )
        return self._welcome(
            frame.request_id, proof(token, "server", self.client_nonce, self.server_nonce)
        )

    def _welcome(self, request_id: int, server_proof: bytes) -> bytes:
        self.phase = Phase.OPEN
        policy = self.policy
        return encode_reply(
            Status.WELCOME, request_id, policy.epoch, policy.max_frame_size, server_proof
        )

    # -- requests ---------------------------------------------------------------------------

    def _requests(self, data: bytes) -> bytes:
        """Answer the requests in ``data`` (the handshake is done)."""
        try:
            bodies = self.reader.feed(data)
        except StoreProtocolError as error:
            self._drop(error.reason)
            return b""
        if len(bodies) == 1:
            return self._answer(bodies[0]) or b""
        replies = [reply for body in bodies if (reply := self._answer(body)) is not None]
        return b"".join(replies)

    def _answer(self, body: bytes) -> bytes | None:
        """Return the encoded reply to one request body, or None if it has none yet."""
        try:
            request = read_request(body)
        except StoreProtocolError as error:
            self.counts.bad_requests += 1
            self.report(f"bad request: {error.reason}")
            if error.request_id is None:
                return None
            return encode_reply(Status.BAD_REQUEST, error.request_id, error.reason)
        self.counts.requests += 1
        return self._take(request)

    @abc.abstractmethod
    def _take(self, request: AnyRequest) -> bytes | None:
        """Answer one decoded request: its reply, or None if it has none yet."""

    @abc.abstractmethod
    async def hold(self, request: WaitRequest) -> bytes:
        """Wait for what a parked ``request`` waits on; return its reply (the shell's half of
        a park)."""

    def _control(self, request: object) -> bytes | None:
        """Answer what the table does not: ``CANCEL``, and a second ``HELLO`` or ``AUTH``."""
        if isinstance(request, Cancel):
            if request.request_id in self._held:
                self.withdrawn.append(request.request_id)
            return None
        assert isinstance(request, Hello | Auth)
        return encode_reply(
            Status.BAD_REQUEST,
            request.request_id,
            f"{request.op.name} after the handshake: HELLO was already sent",
        )

    def _park(self, request: WaitRequest) -> bytes | None:
        timeout = request.timeout
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        if request.request_id in self._held:
            return encode_reply(
                Status.BAD_REQUEST,
                request.request_id,
                f"request id {request.request_id} is already waiting on this connection",
            )
        self._held.add(request.request_id)
        self.parked.append(request)
        return None

    def _fit(self, request: AnyRequest, reply: bytes) -> bytes:
        """Return ``reply``, or a ``VALUE_ERROR`` if it is above the frame limit.

        The client learnt the limit at the handshake; a larger reply would make it drop the
        connection and re-send the request, again and again.
        """
        size, limit = len(reply) - 4, self.policy.max_frame_size
        if size <= limit:
            return reply
        return encode_reply(
            Status.VALUE_ERROR,
            request.request_id,
            f"the reply to {request.op.name.lower()} would be a frame of {size} bytes, which "
            f"exceeds the maximum frame size of {limit}; read fewer or smaller keys at once "
            "(a narrower prefix, fewer keys per multi_get) or raise max_frame_size on both ends",
        )


class StoreSession(Session):
    """A session answered from the server's own store."""

    def __init__(self, store: MemoryStore, peer: str, policy: SessionPolicy) -> None:
        super().__init__(peer, policy)
        self.store = store

    def _take(self, request: AnyRequest) -> bytes | None:
        request_id = request.request_id
        handler = HANDLERS.get(type(request))
        if handler is None:
            return self._control(request)
        try:
            result = handler.answer(self.store, request)
            if result is PARK:
                assert isinstance(request, Get | MultiGet | Wait | WaitForChange)
                return self._park(request)
            reply = handler.reply(request_id, result)
            if len(reply) - 4 <= self.limit:
                return reply
            return self._fit(request, reply)
        except StoreValueError as error:
            return encode_reply(Status.VALUE_ERROR, request_id, str(error))
        except StoreClosedError as error:
            return encode_reply(Status.CLOSED, request_id, str(error))
        except (ValueError, TypeError) as error:
            return encode_reply(Status.INVALID, request_id, str(error))

    async def hold(self, request: WaitRequest) -> bytes:
        return await hold(self.store, request)
