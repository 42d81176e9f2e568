"""The TCP store client: one connection, many concurrent requests, reconnection with backoff.

Each call encodes a frame with a fresh request id, sends it and waits for the reply with that
id; replies are routed to their calls as they are read, so any number of calls share the
connection. The connection and the per-call wake-up come from :mod:`._tcp_transport`, which
picks them for the running loop (on asyncio and uvloop a protocol whose read callback resolves
a bare future per call, with one timer for all deadlines; on trio an anyio stream, a reader
task and an Event per call), so this module is the protocol only, written once.
Waits are held by the server: a call's timeout travels with the request and the server answers
``TIMEOUT`` on its own clock (the client keeps a looser bound of its own in case the server
stalls). A reply too large to read fails its call with :class:`StoreValueError`.

When the connection drops, a supervisor task reconnects with exponential backoff. Calls that
only read, and ``set``/``multi_set`` (writing the same value twice leaves the same state), are
re-sent on the new connection. ``add``, ``compare_set``, ``append`` and ``delete_key`` are not:
if one was sent and its reply never came, it raises :class:`StoreOutcomeUnknownError`, because
re-sending could apply it twice. If the server restarted (a new epoch), its keys are gone and
every pending call fails with :class:`StoreConnectionError` instead of being re-sent. Once
reconnecting has failed for ``connect_timeout``, new calls fail at once until it succeeds.
A server that is gone answers at once: when every attempt to reconnect since the drop was
refused (or reset, on every address), the client says so (:attr:`TCPStore.server_gone`, and a
:class:`StoreServerGone` event to subscribers) and goes on trying in the background.

A connection can also stop answering without closing (a network partition: TCP retransmits
for minutes). With ``request_timeout``, a call that is not a wait gets no more than that for
its reply, and one that gets none *replaces* the connection: it is aborted, and the
supervisor reconnects (each connection attempt bounded by ``request_timeout`` too) and
re-sends what is safe, so the waits held on the dead connection move to the new one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import re
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Self

import anyio
import anyio.abc

from aioelastic._subscribers import Subscribers
from aioelastic.store._api import DEFAULT_TIMEOUT, Snapshot, Store, Value, to_bytes
from aioelastic.store._client_core import ClientHandshake, check_reply
from aioelastic.store._errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
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
    FrameTooLargeError,
    Op,
    Reply,
    Status,
    decode_reply,
    encode_request,
    request_encoders,
)
from aioelastic.store._tcp_transport import (
    CallTiming,
    ClientConnection,
    EventTiming,
    Signal,
    call_timing,
    connect,
)
from aioelastic.store._tls import tls_failure

log = logging.getLogger("aioelastic.store.tcp")

RECEIVE_SIZE = 65536
_REPLY_GRACE = 10.0
"""How long after a wait's timeout the client gives up on the server's own timeout reply."""
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0

_ENCODE = request_encoders()

_UNSAFE_TO_RESEND = frozenset({Op.ADD, Op.COMPARE_SET, Op.APPEND, Op.DELETE_KEY})
"""Operations that could be applied twice if re-sent after a lost reply."""

_REFUSED = frozenset({errno.ECONNREFUSED, errno.ECONNRESET})


def refused(error: BaseException) -> bool:
    """Whether a failed connection attempt was refused or reset: on every address it tried (a
    name with several addresses fails with one error naming each), so nothing listens there."""
    if isinstance(error, ConnectionRefusedError | ConnectionResetError):
        return True
    cause = error.__cause__
    if isinstance(cause, BaseExceptionGroup):  # anyio: one error an address, as the cause
        return all(refused(each) for each in cause.exceptions)
    if isinstance(cause, OSError):
        return refused(cause)
    if not isinstance(error, OSError):
        return False
    if error.errno is not None:
        return error.errno in _REFUSED
    codes = re.findall(r"\[Errno (\d+)\]", str(error))
    return bool(codes) and all(int(code) in _REFUSED for code in codes)


@dataclass(frozen=True, slots=True)
class StoreServerGone:
    """Every attempt to reconnect to the store's server since the connection dropped was
    refused: nothing listens at ``endpoint`` any more (the process serving it ended)."""

    endpoint: str
    detail: str


@dataclass(slots=True, eq=False)
class _Call:
    """One request in flight: its frame, where it was sent, and its outcome."""

    op: Op
    frame: bytes
    subject: str
    signal: Signal
    sent_on: ClientConnection | None = None
    reply: Reply | None = None
    error: StoreError | None = None
    done: bool = False

    def finish(self, reply: Reply | None = None, error: StoreError | None = None) -> None:
        self.reply, self.error, self.done = reply, error, True
        signal = self.signal
        if not signal.done():  # (a cancelled caller's future is done)
            signal.set_result(None)


class TCPStore(Store):
    """A :class:`Store` served by a :class:`TCPStoreServer` at ``host:port``.

    Use as ``async with TCPStore(host, port) as store:``; entering connects (retrying with
    backoff for up to ``connect_timeout`` seconds) and raises :class:`StoreConnectionError` if
    the server cannot be reached, or :class:`StoreRefusedError` if it refuses the token.
    ``request_timeout`` (default: none) replaces a connection that stops answering (see the
    module docstring). ``ssl`` (a client context, see :mod:`._tls`) speaks TLS and checks the
    server's certificate against ``server_hostname`` (default: ``host``).
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
        request_timeout: float | None = None,
        ssl: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        if request_timeout is not None and not request_timeout > 0:
            raise ValueError(f"request_timeout must be positive seconds, not {request_timeout!r}")
        self.host = host
        self.request_timeout = request_timeout
        self.port = port
        self.ssl = ssl
        self.server_hostname = server_hostname or host
        self.timeout = self.resolve_timeout(timeout)
        self.connect_timeout = connect_timeout
        self.max_frame_size = max_frame_size
        self._token = token.encode() if isinstance(token, str) else (token or b"")
        self._calls: dict[int, _Call] = {}
        self._next_id = 0
        self._connection: ClientConnection | None = None
        self._fatal: StoreError | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._owner: object = None  # the task that entered (and exits) the task group
        self._supervisor = anyio.CancelScope()  # the reading task's, which aclose() cancels
        self._closed = False
        self._frame_limit = max_frame_size  # lowered to the server's at the handshake
        self._unreachable: str | None = None  # why reconnecting last gave up, until it succeeds
        self._gone: str | None = None  # every reconnection refused since the drop: why
        self._subscribers: Subscribers[StoreServerGone] = Subscribers(log, "store event")
        self._timing: CallTiming = EventTiming()  # set for the loop on entry

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def server_gone(self) -> str | None:
        """Why the server is gone (every reconnection since the drop was refused), or None."""
        return self._gone

    def subscribe(self, callback: Callable[[StoreServerGone], None]) -> Callable[[], None]:
        """Call ``callback`` with every later :class:`StoreServerGone`; return a function that
        unsubscribes it."""
        return self._subscribers.add(callback)

    # -- connection management ----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._task_group is not None or self._closed:
            raise RuntimeError("a TCPStore can be entered only once")
        self._timing = call_timing()
        connection = await self._connect(self.connect_timeout)
        self._connection = connection
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        task_group.start_soon(self._supervise, connection, self._supervisor)
        self._task_group, self._owner = task_group, anyio.get_current_task().id
        return self

    async def aclose(self) -> None:
        """Close the connection; calls still waiting raise :class:`StoreClosedError`.

        Safe from any task: it stops the reading task alone (the task group's own scope holds
        the ``async with`` block too), and only the task that entered exits the task group;
        from another one, the emptied group is left for the block's end to exit.
        """
        self._closed = True
        self._fail_all(StoreClosedError(f"the store client for {self.endpoint} was closed"))
        self._supervisor.cancel()
        task_group = self._task_group
        if task_group is not None and anyio.get_current_task().id == self._owner:
            self._task_group = None
            await task_group.__aexit__(None, None, None)
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.aclose()

    async def _open(self) -> ClientConnection:
        try:
            return await connect(
                self.host,
                self.port,
                max_frame_size=self.max_frame_size,
                tls=self.ssl,
                server_hostname=self.server_hostname,
            )
        except ssl.SSLError as error:
            raise self._tls_refused(error) from None

    def _tls_refused(self, error: BaseException) -> StoreRefusedError:
        return StoreRefusedError(
            self.endpoint,
            f"TLS handshake failed: {tls_failure(error)}; give every node a certificate and key "
            "from the job's CA (cacert, cert, key), valid for the name it is reached by",
        )

    async def _connect_once(self) -> ClientConnection:
        connection = await self._open()
        try:
            try:
                epoch, limit = await self._handshake(connection)
            except (ssl.SSLError, anyio.BrokenResourceError) as error:
                # The server refused our certificate (TLS 1.3 says so after the handshake).
                if self.ssl is None or not isinstance(error.__cause__ or error, ssl.SSLError):
                    raise
                raise self._tls_refused(error) from None
            connection.epoch = epoch
            self._frame_limit = min(self.max_frame_size, limit)
            connection.dispatch = self._dispatch
            connection.bad_frame = self._bad_frame
            return connection
        except BaseException:
            await connection.aclose()
            raise

    async def _handshake(self, connection: ClientConnection) -> tuple[int, int]:
        """Say HELLO (and prove the token when asked); return the server's epoch and limit."""
        handshake = ClientHandshake(self.endpoint, self._token)
        await connection.send(handshake.start())
        while handshake.welcome is None:
            if answer := handshake.receive(await connection.handshake_frame()):
                await connection.send(answer)
        return handshake.welcome

    async def _connect(self, within: float, *, again: bool = False) -> ClientConnection:
        """Connect, retrying with exponential backoff for up to ``within`` seconds (``again``:
        after a drop, when refusals say the server is gone)."""
        deadline = anyio.current_time() + within
        delay = _BACKOFF_FIRST
        closed_after_tls = ""
        while True:
            try:
                remaining = max(deadline - anyio.current_time(), 0)
                with anyio.fail_after(min(remaining, self.request_timeout or remaining)):
                    connection = await self._connect_once()
                self._gone = None
                return connection
            except StoreRefusedError:
                raise
            except (
                OSError,
                TimeoutError,
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                StoreProtocolError,
            ) as error:
                reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                if again:
                    self._attempt_failed(error, reason)
                if self.ssl is not None and isinstance(error, anyio.EndOfStream):
                    # TLS 1.3 lets a client finish its handshake before the server checks
                    # the client's certificate; a refused one then just sees the close.
                    closed_after_tls = (
                        "; the server closed a TLS connection before answering, as it does "
                        "when it does not accept this client's certificate (check cacert, "
                        "cert and key)"
                    )
            pause = delay * random.uniform(0.5, 1.0)
            if anyio.current_time() + pause >= deadline:
                raise StoreConnectionError(
                    self.endpoint,
                    f"could not connect within {within:g} s (last error: {reason}"
                    f"{closed_after_tls}); check that the store server is running and reachable",
                )
            await anyio.sleep(pause)
            delay = min(delay * 2, _BACKOFF_MAX)

    def _attempt_failed(self, error: BaseException, reason: str) -> None:
        """Note how a reconnection attempt failed: refused means gone (said once), anything
        else (a timeout: maybe a partition) means the server may be alive."""
        closed = isinstance(error, anyio.EndOfStream | anyio.BrokenResourceError)
        if not (refused(error) or (closed and self.ssl is None)):  # (closed: it went away)
            self._gone = None
            return
        if self._gone is None:
            self._gone = (
                f"the store server at {self.endpoint} is gone: reconnecting was refused ({reason})"
            )
            log.info("store %s: %s", self.endpoint, self._gone)
            self._subscribers.emit(StoreServerGone(self.endpoint, self._gone))

    async def _supervise(self, connection: ClientConnection, scope: anyio.CancelScope) -> None:
        """Read replies; when the connection drops, reconnect and re-send what is safe."""
        with scope:
            await self._read_and_reconnect(connection)

    async def _read_and_reconnect(self, connection: ClientConnection) -> None:
        while True:
            await connection.run()
            log.info("store %s: connection lost", self.endpoint)
            self._connection = None
            await connection.aclose()
            for call in list(self._calls.values()):
                if call.sent_on is connection and call.op in _UNSAFE_TO_RESEND:
                    call.finish(
                        error=StoreOutcomeUnknownError(
                            self.endpoint, call.op.name.lower(), call.subject
                        )
                    )
            connection = await self._reconnect(connection.epoch)
            self._connection = connection
            # Calls made since the drop wait unsent (sent_on None); send them with the re-sends.
            for call in list(self._calls.values()):
                if not call.done:
                    call.sent_on = connection
                    await connection.send(call.frame)

    async def _reconnect(self, epoch: int) -> ClientConnection:
        """Connect again (forever, backing off); fail pending calls if that takes too long."""
        while True:
            try:
                connection = await self._connect(self.connect_timeout, again=True)
            except StoreRefusedError as error:
                self._fatal = error
                self._fail_all(error)
                await anyio.sleep_forever()
            except StoreConnectionError as error:
                log.warning("store %s: %s", self.endpoint, error.reason)
                self._unreachable = error.reason
                self._fail_all(error)
                continue
            self._unreachable = None
            if connection.epoch != epoch:
                lost = StoreConnectionError(
                    self.endpoint,
                    "the server restarted and lost its keys while this call was waiting; "
                    "re-read what you need and write it again",
                )
                for call in list(self._calls.values()):
                    if call.sent_on is not None and not call.done:
                        call.finish(error=lost)
            log.info("store %s: reconnected", self.endpoint)
            return connection

    def _fail_all(self, error: StoreError) -> None:
        for call in list(self._calls.values()):
            if not call.done:
                call.finish(error=error)

    def _dispatch(self, connection: ClientConnection, bodies: list[bytes]) -> None:
        """Route replies to their calls."""
        calls = self._calls
        for body in bodies:
            reply = decode_reply(body)
            call = calls.get(reply.request_id)
            if call is not None and call.sent_on is connection:
                call.finish(reply)

    def _bad_frame(self, connection: ClientConnection, error: StoreProtocolError) -> None:
        """A reply could not be read: fail its call (a re-send would fail again), reconnect."""
        log.warning("store server sent a bad frame (%s); reconnecting", error.reason)
        call = self._calls.get(error.request_id) if error.request_id is not None else None
        if call is not None and call.sent_on is connection:
            kind = StoreValueError if isinstance(error, FrameTooLargeError) else StoreProtocolError
            call.finish(
                error=kind(
                    f"the reply to {call.op.name.lower()}({call.subject!r}) could not be read: "
                    f"{error.reason}"
                )
            )

    # -- calls ----------------------------------------------------------------------------------

    async def _call(self, op: Op, subject: str, *fields: Field, wait: float | None = None) -> Reply:
        """Send one request and return its reply; ``wait`` is the server-side timeout, if any."""
        if self._fatal is not None:
            raise self._fatal
        if self._closed or self._task_group is None:
            raise StoreClosedError(f"the store client for {self.endpoint} is not open")
        self._next_id = request_id = (self._next_id + 1) & 0xFFFFFFFF
        frame = _ENCODE[op](request_id, *fields)
        if len(frame) - 4 > self._frame_limit:
            # Sent, it would make the server drop the connection, and a re-send would again.
            raise StoreValueError(
                f"{op.name.lower()}({subject!r}) needs a frame of {len(frame) - 4} bytes, which "
                f"exceeds the maximum frame size of {self._frame_limit} (the smaller of the "
                "client's and the server's); split the value or raise max_frame_size on both ends"
            )
        timing = self._timing
        call = _Call(op, frame, subject, timing.signal())
        self._calls[request_id] = call
        bound = self.timeout if wait is None else wait + _REPLY_GRACE
        if wait is None and self.request_timeout is not None:
            bound = min(bound, self.request_timeout)
        deadline = timing.now() + bound
        try:
            connection = self._connection
            if connection is None:
                self._check_reachable()  # else the supervisor sends it once reconnected
            else:
                # Marked before sending: the reply may be routed before send() returns.
                call.sent_on = connection
                try:
                    if not connection.send_nowait(frame):
                        await connection.send(frame)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    # Unless the supervisor already re-sent or failed it, leave it unsent: the
                    # supervisor sends it once reconnected.
                    if call.sent_on is connection and not call.done:
                        if op in _UNSAFE_TO_RESEND:
                            raise StoreOutcomeUnknownError(
                                self.endpoint, op.name.lower(), subject
                            ) from None
                        call.sent_on = None
            if not call.done:
                await timing.wait(call.signal, deadline)
        except anyio.get_cancelled_exc_class():
            await self._withdraw(call, request_id)
            raise
        finally:
            del self._calls[request_id]
            timing.forget(call.signal)
        if call.error is not None:
            raise call.error
        if call.reply is None:
            if wait is not None:
                raise StoreTimeoutError([subject], wait, self.endpoint)
            if call.sent_on is not None and self.request_timeout is not None:
                await self._replace(call.sent_on)
                if op in _UNSAFE_TO_RESEND:
                    raise StoreOutcomeUnknownError(self.endpoint, op.name.lower(), subject)
            raise StoreConnectionError(
                self.endpoint, f"no reply to {op.name.lower()}({subject!r}) within {bound:g} s"
            )
        if call.reply.status < Status.TIMEOUT:
            return call.reply  # a result: no endpoint string to format for an error
        return check_reply(call.reply, self.endpoint)

    async def _replace(self, connection: ClientConnection) -> None:
        """Abort a connection that stopped answering; the supervisor makes a new one."""
        if connection.alive and connection is self._connection:
            log.warning(
                "store %s: no reply within %g s; replacing the connection",
                self.endpoint,
                self.request_timeout,
            )
            await connection.aclose()

    def _check_reachable(self) -> None:
        """Fail at once if reconnecting has already failed for ``connect_timeout``.

        The supervisor keeps trying; a call made once the server is back goes through.
        """
        if self._unreachable is not None:
            reason = f"not connected: {self._unreachable}; still retrying in the background"
            raise StoreConnectionError(self.endpoint, reason)

    async def _withdraw(self, call: _Call, request_id: int) -> None:
        """Tell the server to drop a waiting request whose caller was cancelled."""
        connection = call.sent_on
        if connection is None or not connection.alive or call.done:
            return
        if call.op in (Op.GET, Op.WAIT, Op.MULTI_GET, Op.WAIT_FOR_CHANGE):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await connection.send(encode_request(Op.CANCEL, request_id))

    # -- the Store contract -----------------------------------------------------------------

    async def set(self, key: str, value: Value, *, ttl: float | None = None) -> None:
        check_ttl(ttl)
        await self._call(Op.SET, check_key(key), key, to_bytes(value), ttl)

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        wait = self.resolve_timeout(timeout)
        reply = await self._call(Op.GET, check_key(key), key, float(wait), wait=wait)
        value = reply.fields[0]
        assert isinstance(value, bytes)
        return value

    async def add(self, key: str, amount: int) -> int:
        if not isinstance(amount, int):
            raise TypeError(f"add amount must be an int, not {type(amount).__name__}")
        reply = await self._call(Op.ADD, check_key(key), key, amount)
        total = reply.fields[0]
        assert isinstance(total, int)
        return total

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        reply = await self._call(
            Op.COMPARE_SET, check_key(key), key, to_bytes(expected), to_bytes(desired)
        )
        value = reply.fields[0]
        assert isinstance(value, bytes)
        return value

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        wait = self.resolve_timeout(timeout)
        names = [check_key(key) for key in keys]
        await self._call(Op.WAIT, ", ".join(names), names, float(wait), wait=wait)

    async def check(self, keys: Sequence[str]) -> bool:
        names = [check_key(key) for key in keys]
        reply = await self._call(Op.CHECK, ", ".join(names), names)
        return bool(reply.fields[0])

    async def delete_key(self, key: str) -> bool:
        reply = await self._call(Op.DELETE_KEY, check_key(key), key)
        return bool(reply.fields[0])

    async def num_keys(self) -> int:
        reply = await self._call(Op.NUM_KEYS, "")
        count = reply.fields[0]
        assert isinstance(count, int)
        return count

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        wait = self.resolve_timeout(timeout)
        names = [check_key(key) for key in keys]
        reply = await self._call(Op.MULTI_GET, ", ".join(names), names, float(wait), wait=wait)
        values = reply.fields[0]
        assert isinstance(values, list)
        return values  # type: ignore[return-value]

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        names = [check_key(key) for key in keys]
        data = [to_bytes(value) for value in values]
        await self._call(Op.MULTI_SET, ", ".join(names), names, data)

    async def append(self, key: str, value: Value) -> None:
        await self._call(Op.APPEND, check_key(key), key, to_bytes(value))

    async def get_prefix(self, prefix: str) -> Snapshot:
        reply = await self._call(Op.GET_PREFIX, check_key(prefix), prefix)
        revision, keys, values = reply.fields
        assert isinstance(revision, int)
        assert isinstance(keys, list)
        assert isinstance(values, list)
        return Snapshot(revision, dict(zip(keys, values, strict=True)))  # type: ignore[arg-type]

    async def ttl_remaining(self, key: str) -> float | None:
        reply = await self._call(Op.TTL_REMAINING, check_key(key), key)
        remaining = reply.fields[0]
        assert remaining is None or isinstance(remaining, float)
        return remaining

    async def wait_for_change(
        self, prefix: str, *, after: int, timeout: float | None = None
    ) -> int:
        wait = self.resolve_timeout(timeout)
        subject = f"{check_key(prefix)}*"
        reply = await self._call(Op.WAIT_FOR_CHANGE, subject, prefix, after, float(wait), wait=wait)
        revision = reply.fields[0]
        assert isinstance(revision, int)
        return revision
