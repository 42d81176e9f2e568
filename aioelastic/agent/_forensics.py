"""Forensics before force: stacks (and a core) of hung workers, taken before the reap.

The agent gives its timer server :meth:`Forensics.before_reap` as the pre-kill hook. The first
expiry of an attempt opens an *incident*: every local worker is captured at once (a shared
scope expires on every rank together, and the ranks still alive are the evidence), other
nodes are asked through the store to capture theirs, the stacks are grouped (``_stacks.py``)
and the report is attached to the group, emitted, and written next to the stack files. Later
expiries of the same attempt wait for that incident instead of capturing again. Other nodes'
requests (``_stack_requests.py``) get this node's part of the incident, or a fresh capture.

Across nodes, a reap waits for the round: once its report is made, a node publishes its part
of the hang in the round's store and waits, bounded by one more capture's time, until every
other node published its own, and only then are its workers reaped. So no node kills before
every node captured (a killed rank would change the evidence elsewhere: its peers' collectives
fail), each node's report names every node's ranks (a later investigator reads the parts
published before it asked, from nodes that may have left since), and the store, which the
agent of the node hosting it takes down when it leaves, stays up until every node read it.
A node whose workers do not hang never publishes: it costs the others that bound, no more.
The server bounds the hook (:attr:`ForensicsSpec.reap_bound`) and reaps afterwards whatever
happened here.

A capture tries py-spy (it attaches from outside, so it works whatever the worker does), then
the worker's faulthandler signal if the worker registered one (``timer/_stackdump.py``), and
says in the record which it used or why there is no stack.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from aioelastic.agent._report import HangReport, StackRecord
from aioelastic.agent._stack_requests import (
    RankStack,
    publish_incident,
    request_stacks,
    wait_for_incidents,
)
from aioelastic.agent._stacks import (
    ThreadStack,
    diagnose,
    format_threads,
    parse_faulthandler,
    parse_py_spy,
    place_of,
)
from aioelastic.errors import replace_json
from aioelastic.store import Store, StoreError
from aioelastic.timer._stackdump import STACK_DIR_ENV, STACK_SIGNAL_ENV, stack_file

if TYPE_CHECKING:
    from aioelastic.agent._group import WorkerGroup, _Worker
    from aioelastic.agent._spec import ForensicsSpec
    from aioelastic.timer import TimerExpired

logger = logging.getLogger(__name__)

STACK_SIGNAL = signal.SIGRTMIN + 4
"""The signal workers register with faulthandler (a real-time one: nothing else uses it)."""

FAULTHANDLER_WAIT = 1.0
"""Seconds a worker gets to write its faulthandler dump after the signal."""

_POLL = 0.01
"""How often the faulthandler file is looked at (its writer is a C signal handler that cannot
tell us it finished; the dump takes microseconds, so a few looks suffice)."""

_UNFINISHED = "the capture did not finish within the hook timeout"
_EXITED = "the worker exited during the capture"


def _has_exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


@dataclass(frozen=True, slots=True)
class Capture:
    """What one capture of one process got."""

    threads: tuple[ThreadStack, ...] = ()
    method: str | None = None
    reason: str | None = None
    core_file: str | None = None
    core_reason: str | None = None


def find_py_spy(setting: str | None) -> str | None:
    """The py-spy executable: ``setting`` itself, or for ``"auto"`` next to Python or on PATH."""
    if setting != "auto":
        return setting
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


async def _run(argv: list[str], timeout: float) -> tuple[int | None, bytes, bytes]:
    """Run ``argv``; (returncode, stdout, stderr), returncode None when it took too long."""
    with anyio.move_on_after(max(timeout, 0.0)):
        done = await anyio.run_process(argv, check=False)
        return done.returncode, done.stdout, done.stderr
    return None, b"", b""


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[0] if lines else "no output"


async def py_spy_dump(py_spy: str, pid: int, timeout: float) -> tuple[tuple[ThreadStack, ...], str]:
    """Threads of ``pid`` by py-spy, or () and why not."""
    code, out, err = await _run([py_spy, "dump", "--pid", str(pid), "--json"], timeout)
    if code is None:
        return (), f"py-spy did not finish within {timeout:.1f} s"
    if code != 0:
        return (), f"py-spy failed: {_last_line(err or out)}"
    try:
        return parse_py_spy(out.decode("utf-8", "replace")), ""
    except ValueError as exc:
        return (), str(exc)


async def faulthandler_dump(
    pid: int, directory: str, signum: int, timeout: float
) -> tuple[tuple[ThreadStack, ...], str]:
    """Threads of ``pid`` from its faulthandler signal, or () and why not."""
    path = stack_file(directory, pid)
    try:
        start = os.stat(path).st_size
    except FileNotFoundError:
        return (), "the worker registered no stack signal (it configured no aioelastic timer)"
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return (), _EXITED
    try:
        if _has_exited(pidfd):
            return (), _EXITED
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except OSError as exc:
            return (), f"cannot signal the worker: {exc.strerror}"
        size, stable, waited = start, 0, 0.0
        while waited < timeout and stable < 3:
            with anyio.move_on_after(_POLL):
                await anyio.wait_readable(pidfd)  # readable: the worker exited
                return (), _EXITED
            waited += _POLL
            now = os.stat(path).st_size
            stable = stable + 1 if now == size and now > start else 0
            size = now
    finally:
        os.close(pidfd)
    if size == start:
        return (), f"the worker wrote no stack within {timeout:.1f} s of signal {signum}"
    return parse_faulthandler(_read_tail(path, start, size)), ""


def _read_tail(path: str, start: int, end: int) -> str:
    with open(path, "rb") as dump:  # a few kB on a local disk
        dump.seek(start)
        return dump.read(end - start).decode("utf-8", "replace")


async def core_dump(pid: int, directory: Path, timeout: float) -> tuple[str | None, str | None]:
    """A native core of ``pid`` by gdb's gcore: (path, None) or (None, why not)."""
    gcore = shutil.which("gcore")
    if gcore is None:
        return None, "gcore (gdb) is not installed"
    prefix = directory / "core"
    code, out, err = await _run([gcore, "-o", str(prefix), str(pid)], timeout)
    path = f"{prefix}.{pid}"
    if code is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # half a core is worse than none
        return None, f"gcore did not finish within {timeout:.1f} s"
    if code != 0:
        return None, f"gcore failed: {_last_line(err or out)}"
    return path, None


async def capture(
    pid: int,
    *,
    py_spy: str | None,
    signal_dir: str | None,
    signum: int,
    timeout: float,
    core_dir: Path | None = None,
) -> Capture:
    """Capture ``pid``'s stacks (and a core into ``core_dir``) within about ``timeout`` s."""
    deadline = anyio.current_time() + timeout
    reasons = []
    threads: tuple[ThreadStack, ...] = ()
    method = None
    if py_spy is not None:
        reserve = FAULTHANDLER_WAIT if signal_dir is not None else 0.0
        threads, why = await py_spy_dump(py_spy, pid, max(timeout - reserve, timeout / 2))
        method = "py-spy" if threads else None
        if why:
            reasons.append(why)
    else:
        reasons.append("py-spy is not installed")
    if not threads and signal_dir is not None:
        left = min(FAULTHANDLER_WAIT, deadline - anyio.current_time())
        threads, why = await faulthandler_dump(pid, signal_dir, signum, left)
        method = "faulthandler" if threads else None
        if why:
            reasons.append(why)
    core_file = core_reason = None
    if core_dir is not None:
        core_file, core_reason = await core_dump(pid, core_dir, deadline - anyio.current_time())
    return Capture(threads, method, "; ".join(reasons) or None, core_file, core_reason)


@dataclass(eq=False)
class _Incident:
    """The stacks of one attempt's hang, taken once for every expiry of that attempt."""

    group: WorkerGroup
    local_done: anyio.Event = field(default_factory=anyio.Event)
    local: tuple[RankStack, ...] = ()
    """This node's captures (what other nodes' requests get: never waiting for theirs)."""
    done: anyio.Event = field(default_factory=anyio.Event)
    """Set once the report is made and the other nodes reported theirs (or had their time)."""
    report: HangReport | None = None
    silent: tuple[int, ...] = ()
    """The nodes that did not answer this node's request (not waited for afterwards)."""


@dataclass(frozen=True, slots=True)
class Peers:
    """The round's store and this node's place in it, for asking the other nodes."""

    store: Store
    node: int
    nodes: int

    def others(self, *, answered: Collection[int] = ()) -> list[int]:
        """The other nodes of the round, but those in ``answered``."""
        return [n for n in range(self.nodes) if n != self.node and n not in answered]


class Forensics:
    """The agent's pre-reap hook and its answers to other nodes (see the module docstring)."""

    def __init__(
        self,
        spec: ForensicsSpec,
        *,
        group: Callable[[], WorkerGroup | None],
        directory: Callable[[int], Path],
        signal_dir: str,
        on_report: Callable[[HangReport], None],
        peers: Callable[[], Peers | None] = lambda: None,
    ) -> None:
        self.spec = spec
        self._group = group
        self._directory = directory
        self._signal_dir = signal_dir
        self._on_report = on_report
        self._peers = peers
        self._py_spy = find_py_spy(spec.py_spy)
        self._incident: _Incident | None = None
        self._requests = 0

    def worker_env(self) -> dict[str, str]:
        """What workers need to register the faulthandler fallback."""
        return {STACK_SIGNAL_ENV: str(int(STACK_SIGNAL)), STACK_DIR_ENV: self._signal_dir}

    async def before_reap(self, expired: TimerExpired) -> None:
        """Capture before ``expired.pid`` is reaped (the first expiry of an attempt: all ranks)."""
        group = self._group()
        if group is None or group.worker_by_pid(expired.pid) is None:
            return
        incident = self._incident
        if incident is None or incident.group is not group:
            incident = self._incident = _Incident(group)
            peers = self._peers()
            if peers is not None and peers.nodes < 2:
                peers = None
            try:
                await self._investigate(incident, expired, peers)
                if peers is not None:
                    await self._wait_for_round(incident, peers)
            finally:
                incident.local_done.set()
                incident.done.set()
        else:
            await incident.done.wait()
        worker = group.worker_by_pid(expired.pid)
        if incident.report is not None and worker is not None:
            _write_error_file(worker.error_file, incident.report, expired.pid)

    async def answer(self, request: int) -> tuple[RankStack, ...]:
        """This node's stacks for another node's request: those of the hang being captured
        here, if there is one, else a fresh capture of every live worker."""
        group = self._group()
        if group is None:
            return ()
        incident = self._incident
        if incident is not None and incident.group is group:
            await incident.local_done.wait()
            return incident.local
        directory = self._directory(group.info.restart_count) / f"request_{request}"
        live = [w for w in group.workers if w.process.returncode is None]
        captures = await self._capture_all(live, timeout=self.spec.timeout * 0.9)
        return _records(live, captures, directory)

    async def _capture_all(
        self,
        live: list[_Worker],
        *,
        timeout: float,
        core_pid: int | None = None,
        core_dir: Path | None = None,
    ) -> dict[int, Capture]:
        """Capture ``live`` workers at once; those unfinished by ``timeout`` are left out."""
        captures: dict[int, Capture] = {}

        async def take(pid: int) -> None:
            captures[pid] = await capture(
                pid,
                py_spy=self._py_spy,
                signal_dir=self._signal_dir,
                signum=STACK_SIGNAL,
                timeout=timeout,
                core_dir=core_dir if pid == core_pid else None,
            )

        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as tg:
                for worker in live:
                    tg.start_soon(take, worker.process.pid)
        return captures

    async def _investigate(
        self, incident: _Incident, expired: TimerExpired, peers: Peers | None
    ) -> None:
        group = incident.group
        first = group.worker_by_pid(expired.pid)
        assert first is not None
        directory = self._directory(group.info.restart_count)
        live = [w for w in group.workers if w.process.returncode is None]
        budget = self.spec.timeout * 0.9  # leave the tail of the capture's bound for the report
        remote: dict[int, tuple[RankStack, ...]] = {}

        async def local() -> None:
            captures = await self._capture_all(
                live,
                timeout=budget,
                core_pid=expired.pid if self.spec.core_dump else None,
                core_dir=directory,
            )
            incident.local = _records(live, captures, directory)
            incident.local_done.set()

        async def others() -> None:
            assert peers is not None
            try:
                answers, _ = await request_stacks(
                    peers.store,
                    nodes=peers.nodes,
                    timeout=budget,
                    own_node=peers.node,
                    published=True,
                )
            except StoreError as exc:
                logger.warning("could not ask the other nodes for their stacks: %s", exc)
                return
            remote.update(answers)

        directory.mkdir(parents=True, exist_ok=True)
        try:
            with anyio.move_on_after(budget):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(local)
                    if peers is not None:
                        tg.start_soon(others)
        finally:
            silent = [] if peers is None else peers.others(answered=remote)
            incident.silent = tuple(silent)
            if not incident.local_done.is_set():
                incident.local = _records(live, {}, directory)
            stacks = [*incident.local, *(s for node in sorted(remote) for s in remote[node])]
            diagnosis = diagnose({s.record.rank: s.place for s in stacks})
            summary = diagnosis.summary
            if silent:
                summary += f"; node{'s' if len(silent) > 1 else ''} "
                summary += f"{', '.join(map(str, silent))} did not answer"
            report = HangReport(
                scope_id=expired.scope_id,
                rank=first.ranks.rank,
                directory=str(directory),
                summary=summary,
                suspects=diagnosis.suspects,
                stacks=tuple(sorted((s.record for s in stacks), key=lambda r: r.rank)),
            )
            incident.report = group.hang = report
            _write_report(directory / "hang.json", report)
            try:
                self._on_report(report)
            except Exception:
                logger.exception("reporting the hang failed")

    async def _wait_for_round(self, incident: _Incident, peers: Peers) -> None:
        """Publish this node's part of the hang, then wait until the round's other nodes
        published theirs, for as long as a capture may take (see the module docstring)."""
        timeout = self.spec.timeout
        try:
            await publish_incident(peers.store, peers.node, incident.local)
            missing = await wait_for_incidents(
                peers.store,
                nodes=peers.nodes,
                own_node=peers.node,
                skip=incident.silent,
                timeout=timeout,
            )
        except StoreError as exc:
            logger.warning("could not share the hang with the other nodes: %s", exc)
            return
        if missing:
            logger.info(
                "node(s) %s reported no hang within %.1f s; reaping",
                ", ".join(map(str, missing)),
                timeout,
            )


def _records(
    live: list[_Worker], captures: Mapping[int, Capture], directory: Path
) -> tuple[RankStack, ...]:
    """The local workers' captures as records, their stacks written to ``directory``."""
    stacks = []
    for worker in live:
        pid, rank = worker.process.pid, worker.ranks.rank
        got = captures.get(pid) or Capture(reason=_UNFINISHED)
        place = place_of(got.threads)
        path = None
        if got.threads:
            path = directory / f"rank{rank}.stacks.txt"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(format_threads(got.threads), encoding="utf-8")
            except OSError as exc:
                logger.warning("cannot write %s: %s", path, exc)
                path = None
        record = StackRecord(
            rank=rank,
            pid=pid,
            method=got.method,
            stack_file=None if path is None else str(path),
            place=None if place is None else place.describe(),
            reason=got.reason,
            core_file=got.core_file,
            core_reason=got.core_reason,
        )
        stacks.append(RankStack(record, place))
    return tuple(stacks)


def _write_report(path: Path, report: HangReport) -> None:
    from aioelastic.events import to_data

    try:
        replace_json(str(path), to_data(report))
    except OSError as exc:
        logger.warning("cannot write %s: %s", path, exc)


def _write_error_file(error_file: str, report: HangReport, pid: int) -> None:
    """A reaped worker's error file, in torch's layout, when the worker left none: its stack
    as the callstack, our fields beside (under ``aioelastic``)."""
    record = report.for_pid(pid)
    if record is None or os.path.exists(error_file):
        return
    text = f"no stack: {record.reason}"
    if record.stack_file is not None:
        with contextlib.suppress(OSError):
            text = Path(record.stack_file).read_text(encoding="utf-8")
    payload = {
        "message": {
            "message": f"the watchdog timer {report.scope_id!r} expired; the worker was reaped",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        },
        "aioelastic": {
            "scope_id": report.scope_id,
            "stack_method": record.method,
            "stack_file": record.stack_file,
            "place": record.place,
            "no_stack_reason": None if record.method else record.reason,
            "core_file": record.core_file,
            "hang_summary": report.summary,
            "suspect_ranks": list(report.suspects),
            "stack_files": {s.rank: s.stack_file for s in report.stacks if s.stack_file},
            "stacks_directory": report.directory,
        },
    }
    try:
        Path(error_file).parent.mkdir(parents=True, exist_ok=True)
        replace_json(error_file, payload)
    except OSError as exc:
        logger.warning("cannot write the error file %s: %s", error_file, exc)


def temporary_directory() -> Callable[[int], Path]:
    """Where an attempt's stack files go without ``--log-dir``: one temporary directory, made
    at the first capture and kept (the report names it)."""
    base: list[Path] = []

    def directory(restart_count: int) -> Path:
        if not base:
            base.append(Path(tempfile.mkdtemp(prefix="aioelastic-stacks-")))
        return base[0] / f"attempt_{restart_count}" / "stacks"

    return directory
