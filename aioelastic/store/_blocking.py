"""A blocking client of the TCP store, for synchronous code: one socket, one call at a time.

Training loops are synchronous, and a worker without torch still needs a store it can use
without an event loop. :class:`BlockingTCPStore` speaks the same protocol as the async
:class:`~aioelastic.store.TCPStore` (the handshake and the meaning of replies come from
:mod:`._client_core`, the frames from :mod:`._tcp_codec`), over a plain blocking socket: each
call sends one frame and reads until the reply with its request id arrives. A reply with an
older id (the answer to a call that gave up waiting) is skipped, so a late reply never answers
the wrong call. Waits are held by the server, with the call's timeout; the client gives the
server :data:`REPLY_GRACE` more before it calls the server unresponsive.

It does not reconnect. When the connection breaks (the server went away, sent bytes that are
not the protocol, or did not answer in time) the call raises and the client is *broken*: every
later call raises :class:`~aioelastic.store.StoreConnectionError` naming the first cause, and
:attr:`BlockingTCPStore.usable` is False, so the caller opens a new one. A call that changes
the store (``add``, ``compare_set``, ``append``, ``delete_key``) whose reply was lost raises
:class:`~aioelastic.store.StoreOutcomeUnknownError`: it may or may not have been applied.

:meth:`BlockingTCPStore.scoped` gives a view of the same connection under a key prefix (as
:class:`~aioelastic.store.PrefixStore` does for async stores); closing a view leaves the
connection open. Calls are serialised by a lock, so threads may share a client; :meth:`close`
from another thread ends a call blocked on the socket with
:class:`~aioelastic.store.StoreClosedError`.
"""

from __future__ import annotations

import contextlib
import math
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self, cast

from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Value, to_bytes
from aioelastic.store._client_core import ClientHandshake, Welcome, check_reply
from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreOutcomeUnknownError,
    StoreProtocolError,
    StoreRefusedError,
    StoreTimeoutError,
    StoreValueError,
)
from aioelastic.store._memory import check_key, check_ttl
from aioelastic.store._tcp_codec import (
    DEFAULT_MAX_FRAME_SIZE,
    Field,
    FrameReader,
    FrameTooLargeError,
    Op,
    Reply,
    Status,
    decode_reply,
    encode_request,
    request_encoders,
)

REPLY_GRACE = 10.0
"""How long after a wait's timeout the client still waits for the server's own reply."""

HANDSHAKE_TIMEOUT = 10.0
"""The most one handshake may take once connected (the server's own bound is the same)."""

HANDSHAKE_FRAME_LIMIT = 64 * 1024
"""The largest reply read before the handshake is done (a server's handshake replies are tiny:
a larger one is another protocol)."""

_RECEIVE_SIZE = 65536
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
_ENCODE = request_encoders()
_CHANGES = frozenset({Op.ADD, Op.COMPARE_SET, Op.APPEND, Op.DELETE_KEY})
"""Calls whose outcome is unknown when their reply is lost (applying them twice differs)."""


class _Broken(Exception):
    """Raised inside a call when the connection cannot be used any more; says why."""

    def __init__(self, reason: str, *, sent: bool, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent
        self.too_large = too_large


class _Interrupted(Exception):
    """Carries the exception an interrupt's check raised out of a call."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


Interrupt = tuple[socket.socket, Callable[[], object]]
"""A socket to watch while a wait blocks, and the check to run when it is readable."""


class _Connection:
    """The socket, its frame reader and request ids; shared by a client and its views."""

    def __init__(self, sock: socket.socket, endpoint: str, welcome: Welcome, limit: int) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.epoch = welcome.epoch
        self.frame_limit = min(limit, welcome.max_frame_size)
        self.reader = FrameReader(limit)
        self.last_id = 0
        self.lock = threading.Lock()
        self.broken: str | None = None
        self.closed = False
        self.busy = False
        # Blocking mode with the kernel's timeouts (SO_RCVTIMEO/SO_SNDTIMEO): a Python socket
        # timeout would poll() before every send and receive, two more system calls a call.
        sock.settimeout(None)
        self._send_bound = -1.0  # SO_SNDTIMEO now
        self._receive_bound = -1.0  # SO_RCVTIMEO now

    def call(
        self,
        op: Op,
        subject: str,
        fields: tuple[Field, ...],
        bound: float,
        interrupt: Interrupt | None = None,
        send_bound: float | None = None,
    ) -> Reply:
        """Send one request and return its reply, within ``bound`` seconds (a wait with
        ``interrupt``: until its check raises, see :meth:`BlockingTCPStore.scoped`); sending
        it may take ``send_bound`` (default: ``bound``)."""
        with self.lock:
            if self.closed:
                raise StoreClosedError(f"the store client for {self.endpoint} was closed")
            if self.broken is not None:
                raise StoreConnectionError(
                    self.endpoint,
                    f"this client's connection broke earlier ({self.broken}); open a new client",
                )
            self.last_id = request_id = (self.last_id + 1) & 0xFFFFFFFF
            frame = _ENCODE[op](request_id, *fields)
            if len(frame) - 4 > self.frame_limit:
                raise StoreValueError(
                    f"{op.name.lower()}({subject!r}) needs a frame of {len(frame) - 4} bytes, "
                    f"which exceeds the maximum frame size of {self.frame_limit} (the smaller of "
                    "the client's and the server's); split the value or raise max_frame_size on "
                    "both ends"
                )
            self.busy = True
            try:
                return self._exchange(
                    op, subject, request_id, frame, bound, interrupt, send_bound or bound
                )
            except _Interrupted as interrupted:
                raise interrupted.error from None
            except _Broken as broken:
                self.broken = broken.reason
                if self.closed:
                    raise StoreClosedError(
                        f"the store client for {self.endpoint} was closed during "
                        f"{op.name.lower()}({subject!r})"
                    ) from None
                if broken.too_large:  # as the async client: the call's fault, not the server's
                    raise StoreValueError(
                        f"the reply to {op.name.lower()}({subject!r}) could not be read: "
                        f"{broken.reason}"
                    ) from None
                if broken.sent and op in _CHANGES:
                    raise StoreOutcomeUnknownError(
                        self.endpoint, op.name.lower(), subject
                    ) from None
                raise StoreConnectionError(self.endpoint, broken.reason) from None
            except BaseException:
                # Interrupted half-way (KeyboardInterrupt, a signal handler's exception): the
                # stream may hold half a frame, so nothing more can be read from it.
                self.broken = f"a call was interrupted during {op.name.lower()}({subject!r})"
                raise
            finally:
                self.busy = False
                if self.closed or self.broken is not None:
                    self.sock.close()

    def _exchange(
        self,
        op: Op,
        subject: str,
        request_id: int,
        frame: bytes,
        bound: float,
        interrupt: Interrupt | None,
        send_bound: float,
    ) -> Reply:
        sock = self.sock
        if send_bound != self._send_bound:
            self._set_timeout(socket.SO_SNDTIMEO, send_bound)
            self._send_bound = send_bound
        # The kernel's receive timeout need only not outlast the call's bound: a receive that
        # times out before the call's deadline is simply made again with what is left. So one
        # timeout serves calls whose bounds are close (a set bounded by the client's timeout,
        # then a get by its wait and the grace), instead of two setsockopt calls a call.
        if not bound / 2 <= self._receive_bound <= bound:
            self._set_receive_bound(bound)
        try:
            sock.sendall(frame)
        except BlockingIOError:
            raise _Broken(
                f"could not send {op.name.lower()} within {send_bound:g} s", sent=True
            ) from None
        except OSError as error:
            raise _Broken(f"sending failed: {error}", sent=True) from None
        deadline = time.monotonic() + bound
        while True:
            if interrupt is not None and interrupt[0].fileno() >= 0:  # (closed: no interrupt)
                self._wait_readable(request_id, deadline, interrupt)
            # The receive, inline (one Python frame fewer a call: with 16 client processes on
            # 2 CPUs every call starts with cold caches, and each frame costs more then).
            try:
                data = sock.recv(_RECEIVE_SIZE)
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining > 0:  # the kernel's timeout was shorter than this call's bound
                    self._set_receive_bound(remaining)
                    continue
                raise _Broken(
                    f"no reply to {op.name.lower()}({subject!r}) within {bound:g} s", sent=True
                ) from None
            except OSError as error:
                raise _Broken(f"the connection failed: {error}", sent=True) from None
            if not data:
                raise _Broken("the server closed the connection", sent=True)
            try:
                bodies = self.reader.feed(data)
            except FrameTooLargeError as error:
                raise _Broken(error.reason, sent=True, too_large=True) from None
            except StoreProtocolError as error:
                raise _Broken(
                    f"the server sent bytes that are not the store protocol: {error.reason}",
                    sent=True,
                ) from None
            for body in bodies:
                try:
                    reply = decode_reply(body)
                except StoreProtocolError as error:
                    raise _Broken(
                        f"the server sent a bad reply: {error.reason}", sent=True
                    ) from None
                if reply.request_id == request_id:
                    return reply  # (calls take turns: no reply can follow the last call's)
            # Not ours yet: the rest of it is still to come, or that was the late reply to a
            # withdrawn wait. What is left of the bound bounds the next receive.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Broken(
                    f"no reply to {op.name.lower()}({subject!r}) within {bound:g} s", sent=True
                )
            if remaining < self._receive_bound:
                self._set_receive_bound(remaining)

    def _set_receive_bound(self, bound: float) -> None:
        """Make the kernel end a receive after ``bound`` seconds."""
        self._set_timeout(socket.SO_RCVTIMEO, bound)
        self._receive_bound = bound

    def _set_timeout(self, option: int, bound: float) -> None:
        """Bound each send (SO_SNDTIMEO) or receive (SO_RCVTIMEO) by ``bound`` seconds (inf:
        unbounded)."""
        seconds = 0.0 if math.isinf(bound) else max(bound, 0.001)
        timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))
        self.sock.setsockopt(socket.SOL_SOCKET, option, timeval)

    def _wait_readable(self, request_id: int, deadline: float, interrupt: Interrupt) -> None:
        """Wait until the socket is readable; whenever the interrupt's socket is, run its
        check, and if that raises, withdraw the request and raise :class:`_Interrupted`."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(interrupt[0], select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if math.isinf(remaining):
                ready = poller.poll()
            else:
                ready = poller.poll(max(remaining, 0) * 1000)
            if not ready or any(fd == self.sock.fileno() for fd, _ in ready):
                return  # the receive says what happened (a timeout included)
            try:
                interrupt[1]()
            except BaseException as error:
                self._withdraw(request_id)
                raise _Interrupted(error) from None

    def _withdraw(self, request_id: int) -> None:
        """Tell the server to drop a wait nobody waits for (its late reply, if any, is
        skipped by its id)."""
        try:
            self.sock.sendall(encode_request(Op.CANCEL, request_id))
        except OSError as error:
            self.broken = f"withdrawing an interrupted wait failed: {error}"

    def usable(self) -> bool:
        """Whether the connection is open and looks healthy (the server did not close it)."""
        if self.closed or self.broken is not None:
            return False
        if not self.lock.acquire(blocking=False):
            return True  # a call is in progress on it
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if readable and not self.sock.recv(1, socket.MSG_PEEK):  # (else: a late reply)
                self.broken = "the server closed the connection"
                self.sock.close()
                return False
            return True
        except OSError as error:
            self.broken = f"the connection failed: {error}"
            self.sock.close()
            return False
        finally:
            self.lock.release()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):  # shutdown wakes a call blocked in recv elsewhere
            self.sock.shutdown(socket.SHUT_RDWR)
        if not self.busy:
            self.sock.close()


class BlockingTCPStore:
    """A blocking client of a :class:`~aioelastic.store.TCPStoreServer` at ``host:port``.

    Constructing it connects (retrying with backoff for up to ``connect_timeout`` seconds while
    the server is not there yet) and raises :class:`StoreConnectionError` if it cannot,
    :class:`StoreRefusedError` if the server refuses the token, :class:`StoreProtocolError` if
    what answers is not an aioelastic store. The methods are those of the async
    :class:`~aioelastic.store.Store`, with the same semantics, without ``await``. ``timeout``
    is the default of waiting calls and bounds every other call's reply. Use it as a context
    manager or call :meth:`close`; see the module docstring for what happens when the
    connection breaks.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: str | bytes | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 30.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = _checked_timeout(timeout)
        self.prefix = ""
        secret = token.encode() if isinstance(token, str) else (token or b"")
        self._connection = _connect(
            host, port, self.endpoint, secret, connect_timeout, max_frame_size
        )
        self._owner = True
        self._closed = False
        self._interrupt: Interrupt | None = None

    # -- the connection -----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        head = f"tcp://{self.host}:{self.port}"
        return f"{head} under {self.prefix!r}" if self.prefix else head

    @property
    def epoch(self) -> int:
        """The server's epoch (it changes when the server restarts and loses its keys)."""
        return self._connection.epoch

    @property
    def usable(self) -> bool:
        """Whether calls can go through: not closed, connection not broken nor closed by the
        server (checked without waiting)."""
        return not self._closed and self._connection.usable()

    def scoped(
        self,
        prefix: str,
        *,
        timeout: float | None = None,
        interrupt: Interrupt | None = None,
    ) -> BlockingTCPStore:
        """A view of this client's connection in which every key lives under ``prefix/``.

        As :class:`~aioelastic.store.PrefixStore`: closing the view leaves the connection open;
        ``num_keys`` counts the keys under the prefix. ``timeout`` defaults to this client's.
        With ``interrupt=(sock, check)``, a wait of the view (``get``, ``multi_get``, ``wait``,
        ``wait_for_change``) calls ``check()`` whenever ``sock`` becomes readable; if it
        raises, the wait is withdrawn from the server and the exception propagates, and the
        connection stays usable (a world's store: its wait ends when the world does).
        """
        if not isinstance(prefix, str):
            raise TypeError(f"the prefix must be str, not {type(prefix).__name__}")
        view = object.__new__(BlockingTCPStore)
        view.host, view.port = self.host, self.port
        view.timeout = self.timeout if timeout is None else _checked_timeout(timeout)
        view.prefix = f"{self.prefix}{prefix}/"
        view._connection = self._connection
        view._owner = False
        view._closed = False
        view._interrupt = self._interrupt if interrupt is None else interrupt
        return view

    def close(self) -> None:
        """Close the connection (a view: only the view); a call blocked in another thread
        raises :class:`StoreClosedError`."""
        self._closed = True
        if self._owner:
            self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"BlockingTCPStore({self.endpoint}, {state})"

    # -- calls ----------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _keys(self, keys: Sequence[str]) -> list[str]:
        if isinstance(keys, str):
            raise TypeError("keys must be a sequence of str, not one str")
        return [self._key(key) for key in keys]

    def _call(self, op: Op, subject: str, *fields: Field, wait: float | None = None) -> Reply:
        if self._closed:
            raise StoreClosedError(f"the store client for {self.endpoint} was closed")
        bound = self.timeout if wait is None else wait + REPLY_GRACE
        interrupt = None if wait is None else self._interrupt
        try:
            reply = self._connection.call(op, subject, fields, bound, interrupt, self.timeout)
            if reply.status < Status.TIMEOUT:
                return reply  # a result: no endpoint string to format for an error
            return check_reply(reply, self.endpoint)
        except StoreTimeoutError as error:
            raise StoreTimeoutError(
                self._unprefixed(error.keys), error.timeout, self.endpoint
            ) from None

    def _unprefixed(self, keys: Sequence[str]) -> list[str]:
        head = self.prefix
        return [key[len(head) :] if head and key.startswith(head) else key for key in keys]

    def _wait_timeout(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else _checked_timeout(timeout)

    def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        """Store ``value`` under ``key``; with ``ttl``, the key expires unless written again."""
        check_ttl(ttl)
        self._call(Op.SET, key, self._key(key), to_bytes(value), ttl)

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until it exists."""
        wait = self._wait_timeout(timeout)
        reply = self._call(Op.GET, key, self._key(key), float(wait), wait=wait)
        value = reply.fields[0]
        assert isinstance(value, bytes)
        return value

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (missing counts as 0); return the sum."""
        if not isinstance(amount, int):
            raise TypeError(f"add amount must be an int, not {type(amount).__name__}")
        total = self._call(Op.ADD, key, self._key(key), amount).fields[0]
        assert isinstance(total, int)
        return total

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; return the value now stored
        (torch's semantics for a missing key, as :meth:`Store.compare_set`)."""
        reply = self._call(
            Op.COMPARE_SET, key, self._key(key), to_bytes(expected), to_bytes(desired)
        )
        value = reply.fields[0]
        assert isinstance(value, bytes)
        return value

    def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        """Return once every key in ``keys`` exists."""
        wait = self._wait_timeout(timeout)
        names = self._keys(keys)
        self._call(Op.WAIT, ", ".join(keys), names, float(wait), wait=wait)

    def check(self, keys: Sequence[str]) -> bool:
        """Return whether every key in ``keys`` exists, without waiting."""
        names = self._keys(keys)
        return bool(self._call(Op.CHECK, ", ".join(keys), names).fields[0])

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        return bool(self._call(Op.DELETE_KEY, key, self._key(key)).fields[0])

    def num_keys(self) -> int:
        """Return the number of keys in the store (in a view: under its prefix)."""
        if self.prefix:
            return len(self.get_prefix("").items)
        count = self._call(Op.NUM_KEYS, "").fields[0]
        assert isinstance(count, int)
        return count

    def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        """Return the values of ``keys`` in order, waiting until all exist."""
        wait = self._wait_timeout(timeout)
        names = self._keys(keys)
        values = self._call(Op.MULTI_GET, ", ".join(keys), names, float(wait), wait=wait).fields[0]
        assert isinstance(values, list)
        return cast(list[bytes], values)

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set every key to its value, atomically."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        names = self._keys(keys)
        self._call(Op.MULTI_SET, ", ".join(keys), names, [to_bytes(value) for value in values])

    def append(self, key: str, value: Value) -> None:
        """Append ``value`` to the bytes at ``key`` (a missing key starts empty)."""
        self._call(Op.APPEND, key, self._key(key), to_bytes(value))

    def get_prefix(self, prefix: str) -> Snapshot:
        """Return every key starting with ``prefix`` and the revision they were read at."""
        full = self.prefix + prefix
        revision, keys, values = self._call(Op.GET_PREFIX, prefix, full).fields
        assert isinstance(revision, int)
        assert isinstance(keys, list)
        assert isinstance(values, list)
        size = len(self.prefix)
        return Snapshot(
            revision,
            {str(key)[size:]: cast(bytes, value) for key, value in zip(keys, values, strict=True)},
        )

    def wait_for_change(self, prefix: str, *, after: int, timeout: float | None = None) -> int:
        """Return once a key starting with ``prefix`` changed at a revision above ``after``;
        return the store's revision then (may return early: re-read, as
        :meth:`Store.wait_for_change` says)."""
        wait = self._wait_timeout(timeout)
        full = self.prefix + prefix
        reply = self._call(Op.WAIT_FOR_CHANGE, f"{prefix}*", full, after, float(wait), wait=wait)
        revision = reply.fields[0]
        assert isinstance(revision, int)
        return revision

    def ttl_remaining(self, key: str) -> float | None:
        """Return the seconds left before ``key`` expires (None: missing or permanent)."""
        remaining = self._call(Op.TTL_REMAINING, key, self._key(key)).fields[0]
        assert remaining is None or isinstance(remaining, float)
        return remaining


def _checked_timeout(timeout: float) -> float:
    if not isinstance(timeout, int | float) or math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
    return float(timeout)


def _connect(
    host: str, port: int, endpoint: str, token: bytes, within: float, limit: int
) -> _Connection:
    """Connect and shake hands, retrying with backoff for up to ``within`` seconds while the
    server cannot be reached (a refusal or another protocol is raised at once)."""
    deadline = time.monotonic() + within
    delay = _BACKOFF_FIRST
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(remaining, 0.001))
        except OSError as error:
            reason = f"{type(error).__name__}: {error}"
        else:
            try:
                bound = min(HANDSHAKE_TIMEOUT, max(deadline - time.monotonic(), 0.001))
                welcome = _handshake(sock, endpoint, token, bound)
                return _Connection(sock, endpoint, welcome, limit)
            except _Broken as broken:
                sock.close()
                reason = broken.reason
            except BaseException:
                sock.close()
                raise
        pause = delay * random.uniform(0.5, 1.0)
        if time.monotonic() + pause >= deadline:
            raise StoreConnectionError(
                endpoint,
                f"could not connect within {within:g} s (last error: {reason}); check that the "
                "store server is running and reachable",
            )
        time.sleep(pause)
        delay = min(delay * 2, _BACKOFF_MAX)


def _handshake(sock: socket.socket, endpoint: str, token: bytes, bound: float) -> Welcome:
    """Shake hands on a connected socket; raise :class:`_Broken` if the server went away."""
    handshake = ClientHandshake(endpoint, token)
    reader = FrameReader(HANDSHAKE_FRAME_LIMIT)
    sock.settimeout(bound)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    to_send = handshake.start()
    bodies: list[bytes] = []
    try:
        while handshake.welcome is None:
            if to_send:
                sock.sendall(to_send)
            while not bodies:
                data = sock.recv(_RECEIVE_SIZE)
                if not data:
                    raise _Broken(_NOT_OURS.format(what="closed"), sent=False)
                bodies = reader.feed(data)
            to_send = handshake.receive(bodies.pop(0))
    except TimeoutError:
        raise _Broken(
            f"no handshake reply within {bound:.3g} s (is it an aioelastic store? torch's own "
            "TCPStore server, for one, never answers this protocol)",
            sent=False,
        ) from None
    except StoreRefusedError:
        raise
    except StoreProtocolError as error:
        raise StoreProtocolError(
            f"{endpoint} answered with something that is not an aioelastic store's handshake "
            f"({error.reason}); check the address and port"
        ) from None
    except ConnectionResetError:
        raise _Broken(_NOT_OURS.format(what="reset"), sent=False) from None
    except OSError as error:
        raise _Broken(f"{type(error).__name__}: {error}", sent=False) from None
    return handshake.welcome


_NOT_OURS = (
    "the server {what} the connection during the handshake (is it an aioelastic store? "
    "torch's own TCPStore server does not speak this protocol)"
)
