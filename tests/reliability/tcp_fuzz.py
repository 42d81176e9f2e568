"""Hostile traffic against a live TCP store server, next to clients whose every result is checked.

``fuzz_codec`` feeds mutated and random frame bodies to the pure decoder. ``abuse_server`` runs,
at the same time against one ``TCPStoreServer``: connections that send mutated frames after a
valid handshake, connections that send garbage from the first byte, slow-loris and half-open
connections, stalled connections that never read their replies, a burst of simultaneous raw
connections that each write and read their own key, and well-formed ``TCPStore`` clients
whose every operation is checked against what it must return.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from aioelastic.store import StoreProtocolError, TCPStore, TCPStoreServer
from aioelastic.store._tcp_codec import (
    PREAMBLE,
    REQUEST_FIELDS,
    FrameReader,
    Op,
    Reply,
    Status,
    decode_reply,
    decode_request,
    encode_preamble,
    encode_request,
)

_FLOATS = [0.0, 0.001, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e308, 5e-324]


def _field(rng: random.Random, code: str) -> object:
    keys = ["fz/a", "fz/b", "fz/", "", "fz/\u2603", "fz/" + "k" * 300]
    if code == "s":
        return rng.choice(keys)
    if code == "b":
        return rng.randbytes(rng.choice([0, 1, 8, 1000]))
    if code == "n":
        return rng.choice([0, 1, -1, 2**63, -(2**70), 10**1000])
    if code == "i":
        return rng.choice([0, 1, -1, 2**62, -(2**63), 2**63 - 1])
    if code == "f":
        return rng.choice(_FLOATS[:2] + _FLOATS[3:4])  # held waits stay short or fail at once
    if code == "F":
        return rng.choice([None, 1.0, -1.0, 1e-9, 1e300])
    if code == "?":
        return rng.random() < 0.5
    if code == "S":
        return [rng.choice(keys) for _ in range(rng.choice([0, 1, 3]))]
    if code == "B":
        return [rng.randbytes(4) for _ in range(rng.choice([0, 1, 3]))]
    raise AssertionError(code)


def valid_body(rng: random.Random, request_id: int) -> bytes:
    """A well-formed request body (without its length prefix) with hostile field values."""
    op = rng.choice([op for op in Op if op not in (Op.HELLO, Op.CANCEL)])
    fields = [_field(rng, code) for code in REQUEST_FIELDS[op]]
    return encode_request(op, request_id, *fields)[4:]  # type: ignore[arg-type]


def mutated_body(rng: random.Random, request_id: int) -> tuple[str, bytes]:
    """A request body, mutated one of several ways; returns the kind and the body."""
    body = bytearray(valid_body(rng, request_id))
    kind = rng.choice(["valid", "flip", "truncate", "extend", "random", "op", "length-field"])
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del body[rng.randrange(len(body)) :]
    elif kind == "extend":
        body += rng.randbytes(rng.randint(1, 16))
    elif kind == "random":
        body = bytearray(rng.randbytes(rng.randint(0, 64)))
    elif kind == "op":
        body[0] = rng.choice([0, 16, 99, 255])
    elif kind == "length-field" and len(body) > 13:
        position = rng.randrange(5, len(body) - 4)
        body[position : position + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff"])
    return kind, bytes(body)


def fuzz_codec(count: int, seed: int) -> tuple[Counter[str], Counter[str]]:
    """Decode ``count`` mutated bodies and a random stream; count outcomes and failures.

    Outcomes: ``decoded`` or ``refused`` (``StoreProtocolError``); anything else raised is a
    failure, counted by exception type (must stay empty).
    """
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    reader = FrameReader(max_frame_size=1 << 16)
    for n in range(count):
        _, body = mutated_body(rng, n)
        for decode in (decode_request, decode_reply):
            try:
                decode(body)
            except StoreProtocolError:
                outcomes["refused"] += 1
            except Exception as exc:
                failures[type(exc).__name__] += 1
            else:
                outcomes["decoded"] += 1
        try:
            reader.feed(len(body).to_bytes(4, "big") + body)
        except StoreProtocolError:
            reader = FrameReader(max_frame_size=1 << 16)
        except Exception as exc:
            failures["reader " + type(exc).__name__] += 1
    return outcomes, failures


@dataclass
class AbuseReport:
    """What one run against a live server did and saw."""

    frames_sent: int = 0
    frame_kinds: Counter[str] = field(default_factory=Counter)
    replies: Counter[str] = field(default_factory=Counter)
    connections: Counter[str] = field(default_factory=Counter)
    dropped_as_expected: Counter[str] = field(default_factory=Counter)
    good_operations: int = 0
    good_mismatches: list[str] = field(default_factory=list)
    simultaneous_ok: int = 0
    simultaneous_failed: Counter[str] = field(default_factory=Counter)
    server_statistics: Any = None
    served_after: bool = False


async def _connect(port: int) -> anyio.abc.SocketStream:
    return await anyio.connect_tcp("127.0.0.1", port)


async def _read_until_closed(stream: anyio.abc.SocketStream, report: AbuseReport) -> None:
    reader = FrameReader()
    while True:
        try:
            data = await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            return
        for body in reader.feed(data):
            report.replies[decode_reply(body).status.name] += 1


async def fuzz_connection(port: int, rng: random.Random, frames: int, report: AbuseReport) -> None:
    """Handshake, send ``frames`` mutated frames, half-close, read replies until the close."""
    async with await _connect(port) as stream:
        report.connections["fuzzing"] += 1
        chunks = [encode_preamble(), encode_request(Op.HELLO, 0, b"")]
        for n in range(1, frames + 1):
            kind, body = mutated_body(rng, n)
            report.frame_kinds[kind] += 1
            chunks.append(len(body).to_bytes(4, "big") + body)
        report.frames_sent += frames
        async with anyio.create_task_group() as group:
            group.start_soon(_read_until_closed, stream, report)
            await stream.send(b"".join(chunks))
            await stream.send_eof()


async def garbage_connection(port: int, rng: random.Random, report: AbuseReport) -> None:
    """Send random bytes from the first byte on; the server must close on us."""
    async with await _connect(port) as stream:
        report.connections["garbage"] += 1
        data = rng.randbytes(rng.randint(11, 5000))
        if data.startswith(PREAMBLE):  # pragma: no cover - astronomically unlikely
            data = b"X" + data
        try:
            await stream.send(data)
        except (anyio.BrokenResourceError, ConnectionError):
            pass  # the server closed on us before all of it was sent: dropped all the same
        else:
            await _read_until_closed(stream, report)
        report.dropped_as_expected["garbage"] += 1


async def silent_connection(port: int, kind: str, report: AbuseReport) -> None:
    """Slow-loris (a partial preamble) or half-open (nothing): dropped at the handshake timeout."""
    async with await _connect(port) as stream:
        report.connections[kind] += 1
        if kind == "slow-loris":
            await stream.send(PREAMBLE[:3])
        await _read_until_closed(stream, report)
        report.dropped_as_expected[kind] += 1


async def stalled_connection(port: int, kind: str, ready: anyio.Event, done: anyio.Event) -> None:
    """After a valid handshake: a partial frame left hanging, or requests never read."""
    async with await _connect(port) as stream:
        await stream.send(encode_preamble() + encode_request(Op.HELLO, 0, b""))
        if kind == "partial-frame":
            await stream.send(b"\x00\x00\x10\x00" + bytes([Op.GET]))
        else:  # never reads: the server's replies fill the socket buffers
            burst = b"".join(encode_request(Op.GET, n, "fz/big", 1.0) for n in range(1, 400))
            with anyio.move_on_after(0):
                await stream.send(burst)
        ready.set()
        await done.wait()


async def simultaneous_connections(port: int, count: int, report: AbuseReport) -> None:
    """``count`` raw connections open at once; each writes and reads back its own key."""
    opened = 0
    all_open = anyio.Event()

    async def one(n: int) -> None:
        try:
            await exchange(n)
        except (OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            report.simultaneous_failed[type(exc).__name__] += 1
            count_opened()

    def count_opened() -> None:
        nonlocal opened
        opened += 1
        if opened == count:
            all_open.set()

    async def exchange(n: int) -> None:
        async with await _connect(port) as stream:
            key, value = f"sim/{n}", f"value {n}".encode()
            await stream.send(
                encode_preamble()
                + encode_request(Op.HELLO, 0, b"")
                + encode_request(Op.SET, 1, key, value, None)
                + encode_request(Op.GET, 2, key, 30.0)
            )
            reader, replies = FrameReader(), list[Reply]()
            while len(replies) < 3:
                replies += [decode_reply(b) for b in reader.feed(await stream.receive())]
            count_opened()
            await all_open.wait()  # hold the connection until all are open together
            statuses = [r.status for r in replies]
            if statuses == [Status.WELCOME, Status.OK, Status.BYTES] and replies[2].fields == (
                value,
            ):
                report.simultaneous_ok += 1

    report.connections["simultaneous"] += count
    async with anyio.create_task_group() as group:
        for n in range(count):
            group.start_soon(one, n)


async def good_client(port: int, client: int, rounds: int, report: AbuseReport) -> None:
    """A well-formed client: every result is compared with what the store must return."""

    def expect(what: str, got: object, want: object) -> None:
        report.good_operations += 1
        if got != want:
            report.good_mismatches.append(f"client {client} {what}: got {got!r}, want {want!r}")

    prefix = f"good/{client}/"
    async with TCPStore("127.0.0.1", port, timeout=120) as store:
        for n in range(rounds):
            key, value = f"{prefix}{n}", f"{client}:{n}".encode()
            await store.set(key, value)
            expect("get", await store.get(key), value)
            expect("compare_set", await store.compare_set(key, value, value + b"!"), value + b"!")
            await store.append(key, b"+")
            expect("append", await store.get(key), value + b"!+")
            await store.multi_set([f"{key}/a", f"{key}/b"], [b"a", b"b"])
            expect("multi_get", await store.multi_get([f"{key}/a", f"{key}/b"]), [b"a", b"b"])
            expect("check", await store.check([key, f"{key}/a"]), True)
            expect("delete", await store.delete_key(f"{key}/b"), True)
            expect("check deleted", await store.check([f"{key}/b"]), False)
            await store.add("good/counter", 1)
        snapshot = await store.get_prefix(prefix)
        expect("own keys", len(snapshot.items), 2 * rounds)


async def abuse_server(
    *,
    seed: int,
    fuzzers: int,
    frames_per_fuzzer: int,
    garbage: int,
    silent: int,
    stalled: int,
    simultaneous: int,
    good_clients: int,
    good_rounds: int,
    handshake_timeout: float = 5.0,
) -> AbuseReport:
    """Run all the hostile traffic at once against one server; return what was seen."""
    rng = random.Random(seed)
    report = AbuseReport()
    async with TCPStoreServer(handshake_timeout=handshake_timeout) as server:
        port = server.port
        await server.store.set("fz/big", b"B" * (1 << 20))
        stalled_ready, finished = [anyio.Event() for _ in range(stalled)], anyio.Event()
        async with anyio.create_task_group() as outer:
            for n in range(stalled):
                kind = "partial-frame" if n % 2 else "never-reads"
                report.connections[kind] += 1
                outer.start_soon(stalled_connection, port, kind, stalled_ready[n], finished)
            for event in stalled_ready:
                await event.wait()
            async with anyio.create_task_group() as group:
                for _ in range(fuzzers):
                    child = random.Random(rng.getrandbits(64))
                    group.start_soon(fuzz_connection, port, child, frames_per_fuzzer, report)
                for _ in range(garbage):
                    group.start_soon(garbage_connection, port, random.Random(rng.random()), report)
                for n in range(silent):
                    kind = "slow-loris" if n % 2 else "half-open"
                    group.start_soon(silent_connection, port, kind, report)
                for client in range(good_clients):
                    group.start_soon(good_client, port, client, good_rounds, report)
                group.start_soon(simultaneous_connections, port, simultaneous, report)
            finished.set()
        async with TCPStore("127.0.0.1", port) as store:
            counter = int(await store.get("good/counter"))
            report.good_operations += 1
            if counter != good_clients * good_rounds:
                report.good_mismatches.append(
                    f"counter {counter}, want {good_clients * good_rounds}"
                )
            await store.set("after", b"ok")
            report.served_after = await store.get("after") == b"ok"
        report.server_statistics = server.statistics()
    return report
