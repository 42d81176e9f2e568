"""Hostile FIFO lines for the timer server, each with the verdict the server must reach.

``generate`` yields ``(line, expected)`` pairs: ``line`` has no newline and is never blank;
``expected`` is the :class:`RejectReason` the server must count, or ``None`` for a line it must
accept (a release, or an acquire for a decoy process the test owns). The verdicts of the
structured kinds are written down here independently of the codec; only the random-byte kinds
ask the codec (their point is that nothing raises). Run as a module, it writes the lines to a
FIFO (lines under ``PIPE_BUF`` only, batched into atomic writes) and prints the expected counts
as JSON::

    python -m tests.reliability.fifo_fuzz FIFO --lines N --seed S --forbidden 0,-1,... \
        --stranger PID --decoys PID,PID --missing PID
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from aioelastic.timer import (
    PIPE_BUF,
    FileTimerServer,
    LineDecoder,
    Rejection,
    RejectReason,
    RequestRejected,
    TimerAcquired,
    TimerEvent,
    TimerReaped,
    TimerReleased,
    TimerRequest,
    TimerServerStatistics,
    decode_line,
)

Verdict = RejectReason | None


@dataclass(frozen=True)
class Targets:
    """The pids the fuzz may name, by what the server must do with an acquire for them."""

    forbidden: Sequence[int]  # pid <= 1, the server's own pid and group: FORBIDDEN_PID
    stranger: int  # a live process of another user: NOT_WATCHED
    decoys: Sequence[int]  # live processes of ours: acquires accepted (signals <= 0 only)
    missing: Sequence[int]  # pids no process has: NO_SUCH_PROCESS


def _line(pid: object, scope: object, expiration: object, signal: object, **extra: object) -> bytes:
    obj = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": expiration}
    obj["signal"] = signal
    obj.update(extra)
    return json.dumps(obj).encode()


_WRONG_TYPES: dict[int, list[object]] = {  # field index -> values of the wrong type
    0: ["9", 9.0, True, None, [9], {"pid": 9}],
    1: [9, 1.5, None, ["s"], False],
    2: ["1e9", True, None, [1e9]],
    3: ["9", 9.0, True, None, [9]],
}


class Fuzzer:
    """A seeded source of hostile lines; ``kinds`` counts what was generated."""

    def __init__(self, seed: int, targets: Targets, *, oversized: bool) -> None:
        self.rng = random.Random(seed)
        self.targets = targets
        self.kinds: Counter[str] = Counter()
        generators = [
            (self.random_bytes, 12),
            (self.random_text, 8),
            (self.truncated, 8),
            (self.deep_json, 3),
            (self.not_an_object, 4),
            (self.wrong_type, 10),
            (self.missing_field, 5),
            (self.wrong_version, 4),
            (self.huge_number, 6),
            (self.not_finite, 5),
            (self.bad_signal, 4),
            (self.forbidden_pid, 10),
            (self.stranger_pid, 6),
            (self.missing_pid, 5),
            (self.decoy_acquire, 6),
            (self.release, 4),
        ]
        if oversized:
            generators.append((self.oversized, 2))
        self._generators = [g for g, _ in generators]
        self._weights = [w for _, w in generators]

    def __iter__(self) -> Iterator[tuple[bytes, Verdict]]:
        choices, gens, weights = self.rng.choices, self._generators, self._weights
        while True:
            for generate in choices(gens, weights, k=1024):
                self.kinds[generate.__name__] += 1
                yield generate()

    # -- helpers ------------------------------------------------------------------------------

    def scope(self) -> str:
        return self.rng.choice(["s", "step", "é", "a b", "x" * 50, "\u2603", ""])

    def expiry(self) -> float:
        return self.rng.choice([0.0, 1.5, 1e9, 1.7e9, 4e9])

    def signal(self) -> int:
        return self.rng.choice([0, 9, 15, 1, 64])

    @staticmethod
    def codec_verdict(line: bytes) -> Verdict:
        decoded = decode_line(line)
        if isinstance(decoded, TimerRequest):  # pragma: no cover - random bytes almost never
            return None if decoded.is_release else RejectReason.NO_SUCH_PROCESS
        return decoded.reason

    # -- kinds of line ------------------------------------------------------------------------

    def random_bytes(self) -> tuple[bytes, Verdict]:
        data = self.rng.randbytes(self.rng.randint(1, 300)).replace(b"\n", b"!") + b"x"
        return data, self.codec_verdict(data)

    def random_text(self) -> tuple[bytes, Verdict]:
        alphabet = '{}[]":,0123456789.-eE truefalsnl\\u"pidscope_version'
        data = "".join(self.rng.choices(alphabet, k=self.rng.randint(1, 120))).encode() + b"{"
        return data, self.codec_verdict(data)

    def truncated(self) -> tuple[bytes, Verdict]:
        full = _line(self.rng.choice(self.targets.decoys), self.scope(), 1e9, 0)
        cut = full[: self.rng.randint(1, len(full) - 1)]
        return cut, RejectReason.INVALID_JSON

    def deep_json(self) -> tuple[bytes, Verdict]:
        opener = self.rng.choice([b"[", b'{"a":', b'{"pid":['])
        most = (PIPE_BUF - 1) // len(opener)
        depth = self.rng.randint(most // 2, most)
        return opener * depth, RejectReason.INVALID_JSON

    def not_an_object(self) -> tuple[bytes, Verdict]:
        return self.rng.choice([b"[1, 2]", b"5", b'"pid"', b"null", b"true", b"-1e999"]), (
            RejectReason.NOT_AN_OBJECT
        )

    def wrong_type(self) -> tuple[bytes, Verdict]:
        fields: list[object] = [self.rng.choice(self.targets.decoys), self.scope(), 1e9, 0]
        index = self.rng.randrange(4)
        fields[index] = self.rng.choice(_WRONG_TYPES[index])
        return _line(*fields), RejectReason.WRONG_TYPE

    def missing_field(self) -> tuple[bytes, Verdict]:
        obj = json.loads(_line(self.rng.choice(self.targets.decoys), "s", 1e9, 0))
        del obj[self.rng.choice(["pid", "scope_id", "expiration_time", "signal"])]
        return json.dumps(obj).encode(), RejectReason.MISSING_FIELD

    def wrong_version(self) -> tuple[bytes, Verdict]:
        version = self.rng.choice([0, 2, -1, 10**30, "1", 1.0, None, True])
        line = _line(self.rng.choice(self.targets.decoys), "s", 1e9, 0, version=version)
        return line, RejectReason.UNSUPPORTED_VERSION

    def huge_number(self) -> tuple[bytes, Verdict]:
        big = self.rng.choice([2**31, 2**63, 10**30, 10**3000])
        return _line(big, self.scope(), self.expiry(), 9), RejectReason.NO_SUCH_PROCESS

    def not_finite(self) -> tuple[bytes, Verdict]:
        value = self.rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
        line = b'{"version": 1, "pid": %d, "scope_id": "s", "expiration_time": %s, "signal": 9}'
        return line % (self.rng.choice(self.targets.decoys), value.encode()), (
            RejectReason.BAD_VALUE
        )

    def bad_signal(self) -> tuple[bytes, Verdict]:
        signum = self.rng.choice([65, 128, 2**31, 2**70])
        return _line(self.rng.choice(self.targets.decoys), "s", 0.0, signum), (
            RejectReason.BAD_VALUE
        )

    def forbidden_pid(self) -> tuple[bytes, Verdict]:
        pid = self.rng.choice([*self.targets.forbidden, -(2**70)])
        return _line(pid, self.scope(), self.expiry(), self.signal()), RejectReason.FORBIDDEN_PID

    def stranger_pid(self) -> tuple[bytes, Verdict]:
        line = _line(self.targets.stranger, self.scope(), self.expiry(), self.signal())
        return line, RejectReason.NOT_WATCHED

    def missing_pid(self) -> tuple[bytes, Verdict]:
        line = _line(self.rng.choice(self.targets.missing), self.scope(), 0.0, 9)
        return line, RejectReason.NO_SUCH_PROCESS

    def decoy_acquire(self) -> tuple[bytes, Verdict]:
        # Signals <= 0 only: the decoys are ours, and an expiry must report, never kill them.
        scope = f"decoy-{self.rng.randrange(64)}"
        expiration = 0.0 if self.rng.random() < 0.02 else 4e9
        line = _line(self.rng.choice(self.targets.decoys), scope, expiration, -self.signal())
        return line, None

    def release(self) -> tuple[bytes, Verdict]:
        pid = self.rng.choice([*self.targets.forbidden, self.targets.stranger, 10**30])
        return _line(pid, self.scope(), self.rng.choice([-1, -1.5, -1e300]), 9), None

    def oversized(self) -> tuple[bytes, Verdict]:
        size = self.rng.randint(PIPE_BUF, 3 * PIPE_BUF)
        return self.rng.randbytes(size).replace(b"\n", b"?"), RejectReason.TOO_LONG


def batches(fuzzer: Fuzzer, count: int) -> Iterator[tuple[bytes, Counter[Verdict]]]:
    """Up to ``count`` lines packed into writes of at most ``PIPE_BUF`` bytes (each atomic)."""
    buffer: list[bytes] = []
    size = 0
    verdicts: Counter[Verdict] = Counter()
    for n, (line, verdict) in enumerate(fuzzer):
        if n == count:
            break
        line += b"\n"
        if size + len(line) > PIPE_BUF:
            yield b"".join(buffer), verdicts
            buffer, size, verdicts = [], 0, Counter()
        buffer.append(line)
        size += len(line)
        verdicts[verdict] += 1
    if buffer:
        yield b"".join(buffer), verdicts


def _pids(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("fifo")
    parser.add_argument("--lines", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--forbidden", type=_pids, required=True)
    parser.add_argument("--stranger", type=int, required=True)
    parser.add_argument("--decoys", type=_pids, required=True)
    parser.add_argument("--missing", type=_pids, required=True)
    args = parser.parse_args(argv)
    targets = Targets(args.forbidden, args.stranger, args.decoys, args.missing)
    fuzzer = Fuzzer(args.seed, targets, oversized=False)
    totals: Counter[Verdict] = Counter()
    fd = os.open(args.fifo, os.O_WRONLY)  # blocking: the pipe's back-pressure paces us
    try:
        for data, verdicts in batches(fuzzer, args.lines):
            written = os.write(fd, data)
            assert written == len(data), "a write under PIPE_BUF is all or nothing"
            totals.update(verdicts)
    finally:
        os.close(fd)
    report = {
        "lines": sum(totals.values()),
        "accepted": totals.pop(None, 0),
        "rejected": {str(reason): n for reason, n in totals.items() if reason is not None},
        "kinds": dict(fuzzer.kinds),
    }
    json.dump(report, sys.stdout)
    return 0


# -- the harness: a live server, a live worker, sentinels and the fuzz writer --------------

WORKER = """
import select, sys, time
from aioelastic.timer import FileTimerClient
client = FileTimerClient(sys.argv[1], connect_timeout=60)
client.acquire_sync("work", time.time() + 3600)
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    client.release_sync("work")
    client.acquire_sync("work", time.time() + 3600)
    time.sleep(0.002)  # slow the workload, so the fuzz gets the CPU  # pace
deadline = time.time() + 0.5
while True:  # a hung step: re-armed with the same deadline until the watchdog reaps us
    client.acquire_sync("hang", deadline)
    time.sleep(0.01)  # pace
"""


class Tally:
    """A cheap subscriber: counts the worker's events, keeps reaps, wakes waiters."""

    def __init__(self, worker: int, halfway: int) -> None:
        self.worker = worker
        self.halfway_after = halfway
        self.seen = 0
        self.worker_lines = 0
        self.worker_rejected: Counter[RejectReason] = Counter()
        self.reaped: list[TimerReaped] = []
        self.barrier_scope = "barrier"
        self.halfway = anyio.Event()
        self.worker_reaped = anyio.Event()
        self.barrier = anyio.Event()

    def __call__(self, event: TimerEvent) -> None:
        self.seen += 1
        if self.seen >= self.halfway_after:
            self.halfway.set()
        if isinstance(event, TimerReaped):
            self.reaped.append(event)
            if event.pid == self.worker:
                self.worker_reaped.set()
        if event.pid != self.worker:
            if isinstance(event, TimerAcquired) and event.scope_id == self.barrier_scope:
                self.barrier.set()
            return
        if isinstance(event, TimerAcquired | TimerReleased):
            self.worker_lines += 1
        elif isinstance(event, RequestRejected):
            self.worker_lines += 1
            self.worker_rejected[event.reason] += 1


@dataclass
class FuzzResult:
    """What one fuzz run measured."""

    report: dict[str, Any]
    statistics: TimerServerStatistics
    worker_lines: int
    worker_rejected: Counter[RejectReason]
    wrong_signals: list[TimerReaped]
    worker_reaped_by: int | None
    worker_returncode: int
    survivors: dict[str, bool]
    seconds: float

    def fuzz_rejected(self) -> dict[str, int]:
        """The server's rejections minus those of the worker's own late lines."""
        counts = Counter({str(r): n for r, n in self.statistics.rejected.items()})
        counts.subtract({str(r): n for r, n in self.worker_rejected.items()})
        return {reason: n for reason, n in counts.items() if n}


def _start(args: list[str], **options: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **options)


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> int:
    pidfd = os.pidfd_open(proc.pid)
    try:
        with anyio.fail_after(timeout):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return proc.wait()


async def fuzz_fifo(directory: str, *, lines: int, seed: int, timeout: float) -> FuzzResult:
    """Fuzz a live ``FileTimerServer`` through its FIFO while a real worker uses it."""
    fifo = os.path.join(directory, "timer.fifo")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        stranger = _start(["sleep", "3600"], user="nobody")
        sentinel = _start(["sleep", "3600"])
        decoys = [_start(["cat"]) for _ in range(2)]
        procs += [stranger, sentinel, *decoys]
        started = time.monotonic()
        async with FileTimerServer(fifo, "fuzz") as server:
            worker = _start([sys.executable, "-c", WORKER, fifo])
            procs.append(worker)
            tally = Tally(worker.pid, halfway=lines // 4)
            server.subscribe(tally)
            assert worker.stdout is not None
            with anyio.fail_after(timeout):
                ready = await anyio.to_thread.run_sync(worker.stdout.readline)
            assert ready == b"ready\n", ready
            writer = _start(
                [
                    sys.executable,
                    "-m",
                    "tests.reliability.fifo_fuzz",
                    fifo,
                    f"--lines={lines}",
                    f"--seed={seed}",
                    "--forbidden=" + ",".join(map(str, {0, -1, 1, os.getpid(), os.getpgrp()})),
                    f"--stranger={stranger.pid}",
                    "--decoys=" + ",".join(str(d.pid) for d in decoys),
                    "--missing=40000,99999,4194304",
                ]
            )
            procs.append(writer)
            with anyio.fail_after(timeout):
                await tally.halfway.wait()
            assert worker.stdin is not None
            worker.stdin.write(b"hang\n")
            worker.stdin.flush()
            with anyio.fail_after(timeout):
                await tally.worker_reaped.wait()
            worker_returncode = await _exited(worker, timeout)
            writer_returncode = await _exited(writer, timeout)
            assert writer.stdout is not None
            output = writer.stdout.read()
            assert writer_returncode == 0, output
            report = json.loads(output)
            # FIFO order: once this line is served, every line written before it was too.
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, _line(decoys[0].pid, tally.barrier_scope, 4e9, 0) + b"\n")
            os.close(fd)
            with anyio.fail_after(timeout):
                await tally.barrier.wait()
            statistics = server.statistics()
        seconds = time.monotonic() - started
        survivors = {
            "stranger (nobody)": stranger.poll() is None,
            "sentinel": sentinel.poll() is None,
            "decoys": all(d.poll() is None for d in decoys),
        }
        reaped_by = next((r.signal for r in tally.reaped if r.pid == worker.pid), None)
        return FuzzResult(
            report=report,
            statistics=statistics,
            worker_lines=tally.worker_lines,
            worker_rejected=tally.worker_rejected,
            wrong_signals=[r for r in tally.reaped if r.pid != worker.pid],
            worker_reaped_by=reaped_by,
            worker_returncode=worker_returncode,
            survivors=survivors,
            seconds=seconds,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def fuzz_codec(lines: int, seed: int, targets: Targets) -> tuple[Counter[str], Counter[str]]:
    """Feed ``lines`` hostile lines (oversized ones too) to a ``LineDecoder`` in random chunks.

    Returns the verdicts that disagree with the generator's, and the kinds generated.
    Acquires that decode are counted as agreeing when the generator expected the server's
    admission step to refuse or accept them (that step is the FIFO run's job).
    """
    fuzzer = Fuzzer(seed, targets, oversized=True)
    chunker = random.Random(seed + 1)
    decoder = LineDecoder()
    expected: list[Verdict] = []
    disagreements: Counter[str] = Counter()
    admission = {None, RejectReason.FORBIDDEN_PID, RejectReason.NOT_WATCHED}
    admission.add(RejectReason.NO_SUCH_PROCESS)

    def check(decoded: list[TimerRequest | Rejection]) -> None:
        for item in decoded:
            if not expected:
                disagreements["unexpected line"] += 1
                continue
            verdict = expected.pop(0)
            got = item.reason if isinstance(item, Rejection) else None
            if got != verdict and not (got is None and verdict in admission):
                disagreements[f"expected {verdict}, got {got}"] += 1

    stream = bytearray()
    for n, (line, verdict) in enumerate(fuzzer):
        if n == lines:
            break
        stream += line + b"\n"
        expected.append(verdict)
        while len(stream) > 8192:
            cut = chunker.randint(1, 8192)
            check(decoder.feed(bytes(stream[:cut])))
            del stream[:cut]
    check(decoder.feed(bytes(stream)))
    disagreements["left over"] += len(expected)
    return +disagreements, fuzzer.kinds


if __name__ == "__main__":
    sys.exit(main())
