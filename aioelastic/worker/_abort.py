"""Leaving a collective whose peer never answers: the worker's side of an abort.

A worker's main thread blocked in a collective (``all_reduce`` waiting for a peer on a lost
node) runs no Python until the collective returns, so the agent's word that the world ended
(``WorldEnded`` on the link) would be read only after the process group's own timeout. Under
``aioelastic run --recovery in-place`` the agent therefore gives each worker a second socket
(its number in ``AIOELASTIC_ABORT_FD``); while the worker is inside ``with world:``, a thread
of its own waits on it, and when the agent asks it to abort that world's collectives it does
what works on the world's backend, then answers what it did:

* **NCCL**: ``torch.distributed.distributed_c10d._abort_process_group()`` (it aborts the
  communicators, which ends the pending work; documented, not checked here: no GPU).
* **gloo**: torch 2.13's ``ProcessGroupGloo.abort()`` and ``_abort_process_group()`` return
  at once and leave a blocked ``all_reduce`` blocked (checked: still blocked 28 s later). What
  does end it is shutting down the process group's TCP connections: gloo's pair then fails
  the pending operation ("Connection closed by peer") within milliseconds, and the process
  can make a new process group at once. The connections are the TCP sockets this process
  opened since it entered the world (the process group's; the world's store connection is
  kept); listening sockets are left alone (gloo's listener dies if shut down).
* **no process group yet** (the main thread may be in ``init_process_group``, waiting in the
  world's store for a peer that will never come): the world's store connection is shut down,
  so that wait raises, and the world forgets that connection (the next world opens another).
* **any other backend**, or ``AIOELASTIC_WORKER_ABORT=0``: the answer is "unavailable"
  and the agent restarts this worker if it does not leave in time.

Pure parts (the wire, reading ``/proc/net/tcp``) are plain functions; :class:`AbortWatch` is
the thread, one per ``with world:``, stopped and joined when the block is left.
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import json
import logging
import os
import select
import socket
import sys
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from aioelastic.worker._protocol import Lines, LinkProtocolError

logger = logging.getLogger("aioelastic.worker")

ABORT_FD_ENV = "AIOELASTIC_ABORT_FD"
"""The environment variable naming the worker's end of its abort socket."""

ABORT_SWITCH_ENV = "AIOELASTIC_WORKER_ABORT"
"""``0`` turns the worker's abort off: it answers "unavailable" (the agent restarts it if it
does not leave its world in time)."""

MAX_LINE = 4096


# -- the wire -------------------------------------------------------------------------------------


class AbortOutcome(enum.Enum):
    """What a worker did when asked to abort a world's collectives."""

    ABORTED = "aborted"
    """Its process group's pending collectives were made to fail."""
    NOTHING = "nothing"
    """It had nothing to abort (no process group, or not in that world any more)."""
    UNAVAILABLE = "unavailable"
    """It has a process group that it cannot abort (the detail says why)."""


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Agent -> worker: make the collectives of ``generation`` fail now (the world ended)."""

    generation: int


@dataclass(frozen=True, slots=True)
class AbortReply:
    """Worker -> agent: what it did about ``generation``'s collectives."""

    generation: int
    outcome: AbortOutcome
    detail: str


class AbortProtocolError(LinkProtocolError, ValueError):
    """A line on the abort socket is not a message of it (the message shows the bytes)."""


def encode_abort(message: AbortRequest | AbortReply) -> bytes:
    """One JSON line."""
    if isinstance(message, AbortRequest):
        body: dict[str, object] = {"abort": message.generation}
    else:
        body = {
            "done": message.generation,
            "outcome": message.outcome.value,
            "detail": message.detail[:1000],
        }
    return json.dumps(body).encode() + b"\n"


def decode_abort(line: bytes) -> AbortRequest | AbortReply:
    """The message ``line`` encodes; :class:`AbortProtocolError` if none."""
    try:
        body = json.loads(line)
        if "abort" in body:
            return AbortRequest(int(body["abort"]))
        return AbortReply(int(body["done"]), AbortOutcome(body["outcome"]), str(body["detail"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise AbortProtocolError(f"not an abort message: {line[:80]!r} ({exc})") from None


class AbortLines(Lines[AbortRequest | AbortReply]):
    """Splits the abort socket's bytes into messages."""

    def __init__(self) -> None:
        super().__init__(decode_abort, AbortProtocolError, MAX_LINE)


# -- which sockets are the process group's --------------------------------------------------------

TCP_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """One row of ``/proc/net/tcp`` or ``tcp6``."""

    inode: int
    established: bool
    local: tuple[str, int]
    remote: tuple[str, int]


def parse_proc_net_tcp(
    text: str, *, v6: bool, inodes: Collection[int] | None = None
) -> list[TcpSocket]:
    """The sockets listed in the text of ``/proc/net/tcp`` (``v6``: ``tcp6``); with
    ``inodes``, only those (the table lists every socket of the network namespace: parsing
    only a process's own keeps an abort quick on a host with thousands of connections)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or (inodes is not None and int(fields[9]) not in inodes):
            continue
        local, remote = (_endpoint(field, v6) for field in fields[1:3])
        found.append(TcpSocket(int(fields[9]), fields[3] == TCP_ESTABLISHED, local, remote))
    return found


def _endpoint(field: str, v6: bool) -> tuple[str, int]:
    address, port = field.split(":")
    return _ip(address, v6), int(port, 16)


def _ip(hex_address: str, v6: bool) -> str:
    """``/proc/net/tcp`` writes addresses as 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if v6 and isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def socket_inodes() -> dict[int, int]:
    """This process's open sockets: inode -> one fd that refers to it."""
    found: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (or the directory's own fd)
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(name)
    return found


def tcp_sockets(inodes: Collection[int] | None = None) -> list[TcpSocket]:
    """Every TCP socket of this network namespace (with ``inodes``: only those)."""
    found = []
    for name, v6 in (("/proc/self/net/tcp", False), ("/proc/self/net/tcp6", True)):
        try:
            with open(name) as table:
                found += parse_proc_net_tcp(table.read(), v6=v6, inodes=inodes)
        except OSError:
            continue
    return found


def connections_to(addresses: Iterable[tuple[str, int]]) -> dict[int, int]:
    """This process's established TCP connections (inode -> fd) to one of ``addresses``."""
    mine, wanted = socket_inodes(), set(addresses)
    return {
        s.inode: mine[s.inode]
        for s in tcp_sockets(mine)
        if s.established and s.inode in mine and s.remote in wanted
    }


def connections_to_close(
    opened_before: Iterable[int], keep: Iterable[tuple[str, int]]
) -> dict[int, int]:
    """This process's established TCP connections (inode -> fd) opened since ``opened_before``
    was taken, except those with an end at an address in ``keep`` (the world's store)."""
    mine, before, kept = socket_inodes(), set(opened_before), set(keep)
    return {
        s.inode: mine[s.inode]
        for s in tcp_sockets(mine)
        if s.established
        and s.inode in mine
        and s.inode not in before
        and s.remote not in kept
        and s.local not in kept
    }


def shut_down(connections: dict[int, int]) -> int:
    """Shut down each connection (inode -> fd); the count shut. An fd that was closed (and
    maybe reused) meanwhile is recognised by its inode and left alone."""
    count = 0
    for inode, fd in connections.items():
        try:
            copy = os.dup(fd)
        except OSError:
            continue
        try:
            if os.fstat(copy).st_ino != inode:
                continue
            with socket.socket(fileno=copy) as sock:
                copy = -1  # the socket object closes it
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
        except OSError:
            continue
        finally:
            if copy >= 0:
                os.close(copy)
    return count


# -- aborting -------------------------------------------------------------------------------------


def abort_collectives(
    opened_before: Iterable[int],
    keep: Iterable[tuple[str, int]],
    forget_store: Callable[[], None] | None = None,
) -> tuple[AbortOutcome, str]:
    """Make the default process group's pending collectives fail, as its backend allows
    (without one, the world's store connection ``keep``, then ``forget_store()``)."""
    if os.environ.get(ABORT_SWITCH_ENV, "1") == "0":
        return AbortOutcome.UNAVAILABLE, f"turned off ({ABORT_SWITCH_ENV}=0)"
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return AbortOutcome.NOTHING, "no process group"
    if not dist.is_initialized():
        count = shut_down(connections_to(keep))
        if not count:
            return AbortOutcome.NOTHING, "no process group"
        if forget_store is not None:
            forget_store()
        return AbortOutcome.ABORTED, f"no process group yet: shut down {count} store connection(s)"
    backend = str(dist.get_backend())
    done = []
    if "gloo" in backend:
        count = shut_down(connections_to_close(opened_before, keep))
        done.append(f"gloo: shut down {count} connection(s)")
    if "nccl" in backend:
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception as exc:  # an abort that fails leaves the fallback: a restart
            return AbortOutcome.UNAVAILABLE, f"nccl: _abort_process_group failed: {exc}"
        done.append("nccl: _abort_process_group()")
    if not done:
        return AbortOutcome.UNAVAILABLE, f"backend {backend!r} has no abort here"
    return AbortOutcome.ABORTED, "; ".join(done)


# -- the thread -----------------------------------------------------------------------------------


class _Channel:
    """This process's abort socket (one for its life) and what is left of a partial line."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lines = AbortLines()


_CHANNEL: _Channel | None = None


def _channel() -> _Channel | None:
    global _CHANNEL
    if _CHANNEL is None:
        raw = os.environ.pop(ABORT_FD_ENV, "")  # a child of this worker must not take it
        if not raw:
            return None
        try:
            _CHANNEL = _Channel(socket.socket(fileno=int(raw)))
        except (ValueError, OSError) as exc:
            logger.warning("%s=%r is not an abort socket (%s): no abort", ABORT_FD_ENV, raw, exc)
            return None
    return _CHANNEL


def resolve(host: str, port: int) -> set[tuple[str, int]]:
    """The addresses ``host:port`` may be (an IP literal as it is; else by lookup)."""
    try:
        return {(str(ipaddress.ip_address(host)), port)}
    except ValueError:
        pass
    try:
        return {(str(info[4][0]), port) for info in socket.getaddrinfo(host, port)}
    except OSError:
        return set()


class AbortWatch:
    """A thread that, while a world lasts, aborts its collectives when the agent asks."""

    def __init__(
        self,
        channel: _Channel,
        generation: int,
        keep: tuple[str, int] | None,
        forget_store: Callable[[], None] | None = None,
    ) -> None:
        self._channel = channel
        self._generation = generation
        self._keep = keep
        self._forget_store = forget_store
        self._before = frozenset(socket_inodes())
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(
            target=self._serve, name=f"aioelastic-abort-gen{generation}", daemon=True
        )  # daemon: only so that a thread stuck in a backend's abort cannot hold the exit
        self._thread.start()

    @classmethod
    def start(
        cls,
        generation: int,
        store: dict[str, object],
        forget_store: Callable[[], None] | None = None,
    ) -> AbortWatch | None:
        """Watch world ``generation`` (its store described by ``store``; ``forget_store()``
        drops the process's connection to it once shut down), if this process has an abort
        socket."""
        channel = _channel()
        if channel is None:
            return None
        host, port = store.get("host"), store.get("port")
        keep = (str(host), int(str(port))) if host is not None and port is not None else None
        return cls(channel, generation, keep, forget_store)

    def stop(self) -> None:
        """Stop the thread and wait for it (an abort under way finishes first)."""
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            logger.warning("the abort thread of generation %d did not stop", self._generation)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        sock = self._channel.sock
        poller = select.poll()  # not select(): a worker may hold more than 1024 fds
        poller.register(sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                data = sock.recv(MAX_LINE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            if not data:
                return  # the agent is gone
            try:
                messages = self._channel.lines.feed(data)
            except AbortProtocolError as exc:
                logger.warning("abort socket: %s; ignored", exc)
                continue
            for message in messages:
                if isinstance(message, AbortRequest):
                    self._answer(message.generation)

    def _answer(self, generation: int) -> None:
        if generation != self._generation:
            outcome, detail = AbortOutcome.NOTHING, f"in generation {self._generation}"
        else:
            keep = set() if self._keep is None else resolve(*self._keep)
            try:
                outcome, detail = abort_collectives(self._before, keep, self._forget_store)
            except Exception as exc:  # report, never die silently: the agent falls back
                outcome, detail = AbortOutcome.UNAVAILABLE, f"abort failed: {exc!r}"
        logger.info("generation %d: abort %s (%s)", generation, outcome.value, detail)
        reply = encode_abort(AbortReply(generation, outcome, detail))
        with contextlib.suppress(OSError):  # the agent is gone; the link tells the main thread
            self._channel.sock.sendall(reply)
