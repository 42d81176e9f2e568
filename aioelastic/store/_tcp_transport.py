"""The transport seam of the TCP store: how bytes move, apart from what they say.

Server side. A :class:`Link` is everything a connection does that does not depend on
how bytes move: it feeds received bytes to the connection's session (ours,
:class:`~._tcp_session.Session`, or torch's, :class:`~._torch_session.TorchSession`), returns
the replies to send at once, holds the waits the session parks (each a task in the server's
task group, cancelled when the client withdraws it or goes away) and, when our session finds
a torch client, hands the connection to a torch session. Two kinds of connection drive a link
and implement :class:`Sender` for it: :class:`ProtocolConnection` from asyncio's callbacks
(the fast path: replies are written from the read callback, no task per read) and
:func:`serve_stream` over an anyio stream (trio, TLS, and the torch-only listener). A
:class:`LinkHost` (the server, or the torch listener) supplies sessions, the task group and the
bookkeeping of open links.

Client side. :func:`connect` opens a :class:`ClientConnection` of the kind the running loop
does best (:class:`ClientProtocol` on asyncio, :class:`ClientStream` elsewhere), and
:func:`call_timing` gives the matching way to wake one call (a :class:`Signal`) and the clock of
its deadline; :class:`~._tcp_client.TCPStore` speaks the protocol over either without knowing
which.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, cast

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from aioelastic._loops import on_asyncio
from aioelastic.store._errors import StoreProtocolError
from aioelastic.store._tcp_codec import PREAMBLE, FrameReader
from aioelastic.store._tcp_requests import WaitRequest
from aioelastic.store._tcp_session import Session
from aioelastic.store._tls import TLS_FAILURES, NotTLSError, wrap_server_stream
from aioelastic.store._torch_session import TorchService, TorchSession

log = logging.getLogger("aioelastic.store.tcp")

RECEIVE_SIZE = 65536

_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
"""What sending to a client that went away raises."""


def peer_name(address: object) -> str:
    """``host:port`` of a socket address, for logs."""
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return "unknown peer" if address is None else str(address)


class Sender(abc.ABC):
    """What a link needs from its connection."""

    @abc.abstractmethod
    async def send(self, data: bytes) -> None:
        """Send whole replies, in order (raises one of ``_GONE`` if the client went away)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection once what was sent is on its way."""


class LinkHost(Protocol):
    """What a link needs from the server that accepted its connection."""

    @property
    def torch(self) -> TorchService:
        """Serves the torch clients."""

    def new_session(self, peer: str) -> Session | None:
        """Our protocol's session for a new connection; None if it serves torch's only."""

    def spawn(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``function(*args)`` in the server's task group."""

    def opened(self, link: Link) -> None:
        """A connection was accepted."""

    def closed(self, link: Link) -> None:
        """A connection is gone (called once)."""


class Link:
    """One connection's protocol, whichever kind of connection carries it (see the module)."""

    def __init__(self, host: LinkHost, peer: str, sender: Sender) -> None:
        self.host = host
        self.peer = peer
        self.sender = sender
        self.session = host.new_session(peer)
        self.torch: TorchSession | None = None
        self.held: dict[int, anyio.CancelScope] = {}
        self.waiting = 0
        """Waits held now."""
        self.lost = False
        host.opened(self)
        if self.session is None:
            self._speak_torch()

    @property
    def closing(self) -> bool:
        """Whether the connection is to be closed once the last replies are sent."""
        return self.session is not None and self.session.closing

    @property
    def handshaking(self) -> bool:
        """Whether our handshake is still to be done."""
        session = self.session
        return session is not None and not session.open and not self.lost

    def received(self, data: bytes) -> bytes:
        """Take received bytes; return the replies to send now (maybe empty)."""
        torch = self.torch
        if torch is not None:
            return torch.receive(data)
        session = self.session
        assert session is not None
        replies = session.receive(data)
        if session.parked:
            parked, session.parked = session.parked, []
            for request in parked:
                scope = self.held[request.request_id] = anyio.CancelScope()
                self.host.spawn(self._hold, session, request, scope)
        if session.withdrawn:
            for request_id in session.withdrawn:
                if (withdrawn := self.held.get(request_id)) is not None:
                    withdrawn.cancel()
            session.withdrawn.clear()
        if session.torch_bytes is not None:
            return self._speak_torch().receive(session.torch_bytes)
        return replies

    def _speak_torch(self) -> TorchSession:
        """The client is torch's: a torch session answers it from now on."""
        torch = self.torch = self.host.torch.session(
            self.peer, send=self.sender.send, hangup=self.sender.close
        )
        self.host.spawn(torch.serve)
        return torch

    async def _hold(self, session: Session, request: WaitRequest, scope: anyio.CancelScope) -> None:
        """Hold a parked wait, then send its reply (unless the client cancelled it)."""
        self.waiting += 1
        reply: bytes | None = None
        try:
            with scope:
                reply = await session.hold(request)
        finally:
            self.waiting -= 1
            del self.held[request.request_id]
        reply = session.settle(request, reply)
        if reply is not None:
            with contextlib.suppress(*_GONE):  # if the client went away, the link cleans up
                await self.sender.send(reply)

    def close(self) -> None:
        """The connection is gone: withdraw its waits (once)."""
        if self.lost:
            return
        self.lost = True
        if self.session is not None:
            self.session.close()
        for scope in self.held.values():
            scope.cancel()
        if self.torch is not None:
            self.torch.close()
        self.host.closed(self)


class ProtocolConnection(asyncio.Protocol, Sender):
    """Drives a :class:`Link` from asyncio's callbacks (no task per read or reply)."""

    transport: asyncio.Transport

    def __init__(self, host: LinkHost, handshake_timeout: float) -> None:
        self.host = host
        self.handshake_timeout = handshake_timeout

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.link = Link(self.host, peer_name(transport.get_extra_info("peername")), self)
        self.timer: asyncio.TimerHandle | None = None
        if self.link.handshaking:
            self.timer = asyncio.get_running_loop().call_later(
                self.handshake_timeout, self._handshake_expired
            )

    def data_received(self, data: bytes) -> None:
        link = self.link
        if (torch := link.torch) is not None:  # a torch client: its session is all there is
            if replies := torch.receive(data):
                self.transport.write(replies)
            return
        replies = link.received(data)
        if replies:
            self.transport.write(replies)
        if link.closing:
            self.transport.close()
        elif self.timer is not None and not link.handshaking:
            self.timer.cancel()
            self.timer = None

    def _handshake_expired(self) -> None:
        self.timer = None
        link = self.link
        if link.handshaking and link.session is not None:
            link.session.expire_handshake()
            self.transport.abort()

    def pause_writing(self) -> None:
        self.transport.pause_reading()  # a client that does not read gets no more answers

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.link.close()

    async def send(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.transport.close()

    def abort(self) -> None:
        self.transport.abort()


class _StreamSender(Sender):
    """Sends on an anyio stream (the TLS stream over it, once TLS is up), one send at a time."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.channel = stream
        self.lock = anyio.Lock()
        self.reading = anyio.CancelScope()

    async def send(self, data: bytes) -> None:
        async with self.lock:
            await self.channel.send(data)

    def close(self) -> None:
        self.reading.cancel()  # the reading loop ends, and closes the stream


async def serve_stream(
    host: LinkHost,
    stream: anyio.abc.SocketStream,
    *,
    handshake_timeout: float = 0.0,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Drive a :class:`Link` over ``stream`` until either end closes it.

    With ``tls`` the TLS handshake runs first, so a peer that fails it is counted and refused
    before anything is read; it and our handshake together get ``handshake_timeout``.
    """
    try:
        address = stream.extra(SocketAttribute.remote_address)
    except anyio.TypedAttributeLookupError:
        address = None
    sender = _StreamSender(stream)
    link = Link(host, peer_name(address), sender)

    async def exchange() -> bool:
        """Receive once, send what the link answers; return whether to go on."""
        replies = link.received(await sender.channel.receive(RECEIVE_SIZE))
        if replies:
            await sender.send(replies)
        return not link.closing

    try:
        async with stream:
            with sender.reading:
                if link.handshaking:
                    assert link.session is not None
                    with anyio.move_on_after(handshake_timeout):
                        if tls is not None:
                            try:
                                sender.channel = await wrap_server_stream(stream, tls)
                            except TLS_FAILURES as error:
                                refusal = link.session.refuse_tls(error)
                                if isinstance(error, NotTLSError) and error.first.startswith(
                                    PREAMBLE
                                ):
                                    await stream.send(refusal)  # our client, without TLS: say so
                                return
                        while link.handshaking:
                            if not await exchange():
                                return
                    if link.handshaking:
                        link.session.expire_handshake()
                        return
                while await exchange():
                    pass
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the client went away
    except OSError as error:
        log.debug("store client %s: connection error: %s", link.peer, error)
    finally:
        link.close()


# -- the client's side ----------------------------------------------------------------------


Dispatch = Callable[["ClientConnection", list[bytes]], None]
BadFrame = Callable[["ClientConnection", StoreProtocolError], None]


class ClientConnection(abc.ABC):
    """A connection to the server: sends whole frames, hands received frames to ``dispatch``."""

    epoch = 0
    alive = True
    dispatch: Dispatch | None = None
    bad_frame: BadFrame | None = None

    @abc.abstractmethod
    async def send(self, data: bytes) -> None:
        """Send whole frames (a cancelled caller never leaves half a frame behind)."""

    def send_nowait(self, data: bytes) -> bool:
        """Send whole frames now if this connection can without waiting (raising as
        :meth:`send` does); False if it cannot, and the caller awaits :meth:`send`."""
        return False

    @abc.abstractmethod
    async def handshake_frame(self) -> bytes:
        """Wait for the next frame of the handshake (before ``dispatch`` is set)."""

    @abc.abstractmethod
    async def run(self) -> None:
        """Deliver frames to ``dispatch`` until the connection ends."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the connection at once."""


class ClientProtocol(ClientConnection, asyncio.Protocol):
    """On asyncio: frames are routed from the read callback, writes never block the caller."""

    transport: asyncio.Transport

    def __init__(self, max_frame_size: int) -> None:
        self.reader = FrameReader(max_frame_size)
        self.early: list[bytes] = []
        self.error: Exception | None = None
        self.arrived = anyio.Event()
        self.lost = anyio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.reader.feed(data)
            if self.dispatch is not None:
                self.dispatch(self, bodies)
            elif bodies:
                self.early += bodies
                self.arrived.set()
        except StoreProtocolError as error:
            self.alive = False
            self.transport.abort()
            if self.bad_frame is not None:
                self.bad_frame(self, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.error = exc
        self.arrived.set()
        self.lost.set()

    async def send(self, data: bytes) -> None:
        self.send_nowait(data)

    def send_nowait(self, data: bytes) -> bool:
        if self.transport.is_closing():
            raise anyio.BrokenResourceError
        self.transport.write(data)  # never blocks: the transport buffers what the socket won't
        return True

    async def handshake_frame(self) -> bytes:
        while not self.early:
            if self.lost.is_set():
                if isinstance(self.error, ssl.SSLError):
                    raise self.error
                raise anyio.EndOfStream
            self.arrived = anyio.Event()
            await self.arrived.wait()
        return self.early.pop(0)

    async def run(self) -> None:
        await self.lost.wait()

    async def aclose(self) -> None:
        self.alive = False
        self.transport.abort()


class ClientStream(ClientConnection):
    """On other backends (trio): an anyio stream and a reading loop."""

    def __init__(self, stream: anyio.abc.ByteStream, max_frame_size: int) -> None:
        self.stream = stream
        self.reader = FrameReader(max_frame_size)
        self.lock = anyio.Lock()
        self.early: list[bytes] = []

    async def send(self, data: bytes) -> None:
        with anyio.CancelScope(shield=True):
            async with self.lock:
                await self.stream.send(data)

    async def handshake_frame(self) -> bytes:
        while not self.early:
            self.early = self.reader.feed(await self.stream.receive(RECEIVE_SIZE))
        return self.early.pop(0)

    async def run(self) -> None:
        receive, feed = self.stream.receive, self.reader.feed
        try:
            while True:
                bodies = feed(await receive(RECEIVE_SIZE))
                assert self.dispatch is not None
                self.dispatch(self, bodies)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        except StoreProtocolError as error:
            if self.bad_frame is not None:
                self.bad_frame(self, error)
        finally:
            self.alive = False

    async def aclose(self) -> None:
        self.alive = False
        await anyio.aclose_forcefully(self.stream)


class Signal(Protocol):
    """Wakes the caller of one call once its outcome is known: on asyncio the loop's own
    future (no wrapper: a task awaits an exact future fastest), elsewhere an
    :class:`EventSignal`. Set as a future is: ``if not s.done(): s.set_result(None)``."""

    def done(self) -> bool:
        """Whether it was set."""

    def set_result(self, result: None) -> None:
        """Wake the caller (once)."""


class CallTiming(Protocol):
    """A client's way to make, await and drop its calls' signals, and the clock of their
    deadlines, for the running loop (see :func:`call_timing`)."""

    signal: Callable[[], Signal]
    """Makes a new call's signal."""
    now: Callable[[], float]
    """The clock of the deadlines."""

    def wait(self, signal: Any, deadline: float) -> Awaitable[None]:
        """An awaitable that returns once ``signal`` is set, or at ``deadline`` on the
        :attr:`now` clock (awaited once; :meth:`forget` follows, however it ended)."""

    def forget(self, signal: Any) -> None:
        """The call is over: drop what :meth:`wait` registered."""


class Alarm(CallTiming):
    """On asyncio: one timer for all the waiting calls of a client, armed at the earliest
    deadline among them (a timer per call costs about 5 us on uvloop, a quarter of a call);
    each call's signal is a bare future its caller awaits."""

    _EARLY = 0.001
    """A deadline this close is due: loops round timers to the millisecond."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[asyncio.Future[None], float] = {}
        self.at = math.inf
        self.timer: asyncio.TimerHandle | None = None
        self.signal = loop.create_future  # (a bound C method: no Python frame a call)
        self.now = loop.time

    def wait(self, signal: asyncio.Future[None], deadline: float) -> Awaitable[None]:
        self.waiting[signal] = deadline
        if deadline < self.at:
            self._arm(deadline)
        return signal  # awaited by the caller itself: no coroutine frame per call

    def forget(self, signal: asyncio.Future[None]) -> None:
        self.waiting.pop(signal, None)

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.at = at
        self.timer = self.loop.call_at(at, self._ring)

    def _ring(self) -> None:
        """Wake the calls whose deadline passed; re-arm for the earliest of the others."""
        self.timer, self.at = None, math.inf
        due = self.loop.time() + self._EARLY
        later = math.inf
        for signal, deadline in list(self.waiting.items()):
            if deadline <= due:
                del self.waiting[signal]
                if not signal.done():
                    signal.set_result(None)
            elif deadline < later:
                later = deadline
        if later < math.inf:
            self._arm(later)


class EventSignal:
    """On other backends (trio): an anyio Event, set as a future is."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()

    def done(self) -> bool:
        return self.event.is_set()

    def set_result(self, result: None) -> None:
        self.event.set()


class EventTiming(CallTiming):
    """On other backends (trio): each call waits on its Event under a cancel scope."""

    def __init__(self) -> None:
        self.signal = EventSignal
        self.now = anyio.current_time

    def wait(self, signal: EventSignal, deadline: float) -> Awaitable[None]:
        return self._wait(signal, deadline)

    def forget(self, signal: EventSignal) -> None:
        pass  # the cancel scope of _wait went with it

    async def _wait(self, signal: EventSignal, deadline: float) -> None:
        with anyio.CancelScope(deadline=deadline):
            await signal.event.wait()


async def connect(
    host: str,
    port: int,
    *,
    max_frame_size: int,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> ClientConnection:
    """Open a client connection of the kind the running loop does best (raises
    ``ssl.SSLError`` when TLS fails at once)."""
    if on_asyncio():
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: ClientProtocol(max_frame_size),
            host,
            port,
            ssl=tls,
            server_hostname=server_hostname if tls else None,
        )
        return protocol
    if tls is None:
        stream: anyio.abc.ByteStream = await anyio.connect_tcp(host, port)
    else:
        stream = await anyio.connect_tcp(
            host, port, ssl_context=tls, tls_hostname=server_hostname, tls_standard_compatible=False
        )
    return ClientStream(stream, max_frame_size)


def call_timing() -> CallTiming:
    """The way to time and wake calls that suits the running loop."""
    if on_asyncio():
        return Alarm(asyncio.get_running_loop())
    return EventTiming()
