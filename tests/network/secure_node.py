"""A rendezvous node, an intruder and a wiretap, run on the hosts of a test's network.

``python secure_node.py MODE ENDPOINT ARGS...``; each mode prints what happened, one line:

- ``node ENDPOINT IS_HOST KEY=VALUE...``: a c10d node of a two-node job; prints ``listening``
  once its store is up, then ``joined rank R of W closed C``, then waits for a line on stdin.
- ``attack ENDPOINT KIND [FILE]``: one intrusion (``no-token``, ``wrong-token FILE``,
  ``replay FILE``, ``garbage``, ``join-no-token``, ``no-cert CACERT``); prints ``refused ...``
  or ``closed ...`` when kept out, ``admitted`` if not.
- ``record ENDPOINT TOKEN_FILE OUT``: an authenticated session (writes, then deletes, the key
  ``planted``) through a loopback proxy that saves the bytes the client sent to OUT.
- ``check ENDPOINT TOKEN_FILE KEY``: prints ``present`` or ``absent``.
"""

from __future__ import annotations

import random
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc

from aioelastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aioelastic.rendezvous._c10d import parse_endpoint
from aioelastic.store import StoreConnectionError, StoreRefusedError, TCPStore
from aioelastic.store._auth import read_token
from aioelastic.store._tcp_codec import FrameReader, decode_reply
from aioelastic.store._tls import client_context


def params(endpoint: str, **conf: str) -> RendezvousParameters:
    return RendezvousParameters("c10d", endpoint, "job", 2, 2, **conf)


async def node(endpoint: str, is_host: str, *options: str) -> None:
    conf = dict(option.split("=", 1) for option in options)
    async with get_rendezvous_handler(params(endpoint, is_host=is_host, **conf)) as handler:
        print("listening", flush=True)
        info = await handler.next_rendezvous()
        closed = await handler.is_closed()
        print(f"joined rank {info.rank} of {info.world_size} closed {closed}", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)


def raw(endpoint: str, data: bytes) -> str:
    """Send ``data`` from the first byte; say how the server answered before it closed."""
    host, port = parse_endpoint(endpoint)
    with socket.create_connection((host, port), timeout=30) as sock:
        try:
            sock.sendall(data)
            reader, statuses, received = FrameReader(), [], b""
            while chunk := sock.recv(65536):
                received += chunk
                statuses += [decode_reply(body).status.name for body in reader.feed(chunk)]
        except ConnectionResetError:
            statuses = ["reset"]
        except Exception as error:  # a non-frame answer (TLS alert bytes, say)
            statuses = [type(error).__name__]
    if "WELCOME" in statuses:
        return f"admitted {statuses}"
    return f"{'refused' if 'REFUSED' in statuses else 'closed'} {statuses}"


async def client_outcome(store: TCPStore) -> str:
    try:
        async with store:
            return "admitted"
    except StoreRefusedError as error:
        return f"refused {error.reason}"
    except StoreConnectionError as error:
        return f"closed {error.reason}"


async def attack(endpoint: str, kind: str, path: str = "") -> None:
    host, port = parse_endpoint(endpoint)
    if kind == "no-token":
        outcome = await client_outcome(TCPStore(host, port, connect_timeout=2))
    elif kind == "wrong-token":
        store = TCPStore(host, port, token=read_token(path), connect_timeout=5)
        outcome = await client_outcome(store)
    elif kind == "no-cert":
        store = TCPStore(host, port, ssl=client_context(path), connect_timeout=2)
        outcome = await client_outcome(store)
    elif kind == "replay":
        recorded = await anyio.Path(path).read_bytes()
        outcome = await anyio.to_thread.run_sync(raw, endpoint, recorded)
    elif kind == "garbage":
        junk = random.Random(20).randbytes(3000)
        outcome = await anyio.to_thread.run_sync(raw, endpoint, junk)
    elif kind == "join-no-token":
        try:
            async with get_rendezvous_handler(
                params(endpoint, is_host="false", read_timeout="5")
            ) as handler:
                await handler.set_closed()
                outcome = "admitted"
        except RendezvousConnectionError as error:
            outcome = f"refused {error}"
    else:
        raise SystemExit(f"unknown attack {kind!r}")
    print(outcome, flush=True)


@dataclass
class Recording:
    """What went through a :func:`recording_proxy`, per connection and direction."""

    port: int = 0
    sent: list[bytes] = field(default_factory=list)
    """Client to server, each connection's bytes joined."""
    received: list[bytes] = field(default_factory=list)


@asynccontextmanager
async def recording_proxy(host: str, port: int) -> AsyncIterator[Recording]:
    """A loopback TCP proxy to ``host:port`` that records every byte in both directions."""
    recording = Recording()

    async def pipe(
        source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, log: list[bytes], index: int
    ) -> None:
        try:
            async for chunk in source:
                log[index] += chunk
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            await sink.aclose()

    async def serve(client: anyio.abc.SocketStream) -> None:
        index = len(recording.sent)
        recording.sent.append(b"")
        recording.received.append(b"")
        async with (
            client,
            await anyio.connect_tcp(host, port) as upstream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(pipe, client, upstream, recording.sent, index)
            tg.start_soon(pipe, upstream, client, recording.received, index)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        recording.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(listener.serve, serve)
        yield recording
        tg.cancel_scope.cancel()


async def record(endpoint: str, token_file: str, out: str) -> None:
    host, port = parse_endpoint(endpoint)
    async with (
        recording_proxy(host, port) as wire,
        TCPStore("127.0.0.1", wire.port, token=read_token(token_file)) as store,
    ):
        await store.set("planted", b"by the real client")
        await store.delete_key("planted")
    await anyio.Path(out).write_bytes(wire.sent[0])
    print(f"recorded {len(wire.sent[0])} bytes", flush=True)


async def check(endpoint: str, token_file: str, key: str) -> None:
    host, port = parse_endpoint(endpoint)
    async with TCPStore(host, port, token=read_token(token_file)) as store:
        print("present" if await store.check([key]) else "absent", flush=True)


MODES = {"node": node, "attack": attack, "record": record, "check": check}

if __name__ == "__main__":
    anyio.run(MODES[sys.argv[1]], *sys.argv[2:])
