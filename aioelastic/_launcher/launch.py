"""From ``aioelastic run``'s flags to a running agent: the launch configuration, the console
reporter, signal routing and the failure report."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from aioelastic._launcher.torch_logs import Layout
    from aioelastic.agent._agent import ElasticAgent
    from aioelastic.agent._events import AgentEvent
    from aioelastic.agent._guardian import Guardian
    from aioelastic.agent._report import WorkerFailure
    from aioelastic.agent._spec import LogSpec
    from aioelastic.events import EventRecord

PROG = "aioelastic run"


class FlagError(Exception):
    """A flag's value is wrong; the message names the flag."""


def one_line_error(message: str) -> NoReturn:
    """Print ``message`` as the launcher's one-line error and exit with status 2."""
    print(f"{PROG}: error: {message} (see '{PROG} --help')", file=sys.stderr)
    raise SystemExit(2)


# -- from flags to a launch ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """Everything ``aioelastic run`` decided from its flags."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str
    rdzv_conf: dict[str, str]
    local_addr: str | None
    max_restarts: int
    role: str
    title: str
    entrypoint: str
    args: tuple[str, ...]
    logs: LogSpec
    signals: tuple[signal.Signals, ...]
    shutdown_timeout: float
    events_file: str | None = None
    metrics_port: int | None = None
    reap_core_dump: bool = False
    recovery: str = "restart"
    spares: int = 0
    recovery_timeout: float = 60.0
    virtual_local_rank: bool = False
    numa_binding: str | None = None
    event_log_handler: str = "null"
    torch_store: str = "auto"
    """``expose``, ``loopback``, or ``auto``: torchrun's (exposed) unless the job's store is
    protected by a token or TLS, or the job is one node (see :func:`torch_store_arrangement`)."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Added to each worker's environment (a Python worker's exit hook)."""
    preemption_file: str | None = None
    preload: tuple[str, ...] = ()
    fork_template: str = "auto"


def resolve_nproc(value: int | str) -> int:
    """Turn ``cpu``/``gpu``/``xpu``/``auto`` into a count; torch is imported only for devices.

    ``cpu`` counts the CPUs this process may use (affinity and cgroup quota); ``auto`` takes
    the CUDA devices, else the XPU devices, else the CPUs.
    """
    from aioelastic._launcher.cpus import usable_cpu_count

    if isinstance(value, int):
        return value
    if value == "cpu":
        return usable_cpu_count()
    try:
        import torch  # only when asked for devices
    except ImportError:
        if value != "auto":
            raise FlagError(f"--nproc-per-node {value} needs torch installed") from None
        return usable_cpu_count()
    kinds = {"gpu": ("cuda",), "xpu": ("xpu",), "auto": ("cuda", "xpu")}[value]
    for kind in kinds:
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available() and backend.device_count():
            return int(backend.device_count())
    if value != "auto":
        name = {"gpu": "CUDA", "xpu": "XPU"}[value]
        raise FlagError(f"--nproc-per-node {value}: no {name} device is available")
    return usable_cpu_count()


def logs_specs_layout(name: str, logs: LogSpec, nproc: int) -> Layout:
    """``--logs-specs NAME``: the torch ``LogsSpecs`` class of that ``torchrun.logs_specs``
    entry point, built from the log flags as torchrun builds it."""
    from aioelastic._entry_points import find_entry_point
    from aioelastic._launcher.torch_logs import torch_layout

    if importlib.util.find_spec("torch") is None:
        raise FlagError(f"--logs-specs {name!r} names a torch LogsSpecs class: install torch")
    found = find_entry_point("torchrun.logs_specs", name)
    if found is None:
        raise FlagError(
            f"--logs-specs {name!r}: no entry point of that name in torchrun.logs_specs"
        )
    try:
        return torch_layout(
            found,
            log_dir=logs.log_dir,
            redirects=logs.redirects,
            tee=logs.tee,
            local_ranks_filter=logs.local_ranks_filter,
            local_world_size=nproc,
            inherit=logs.inherit_console,
        )
    except Exception as exc:  # the plug-in's own failure: say which one
        raise FlagError(
            f"--logs-specs {name!r} ({found.value}) failed: {type(exc).__name__}: {exc}"
        ) from None


def implicit_standalone(
    args: argparse.Namespace, backend: str, endpoint: str, conf: dict[str, str]
) -> bool:
    """Whether a default single-node run is a standalone one, as torchrun makes it: the static
    backend with no endpoint nor --master-port and one node at most (and no static-only
    --rdzv-conf key). Its workers get a run id, and no port 29500 is taken."""
    from aioelastic.rendezvous._parameters import ELASTIC_KEYS

    return (
        backend == "static"
        and not endpoint
        and args.master_port is None
        and args.nnodes[1] == 1
        and set(conf) <= ELASTIC_KEYS
    )


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Check the flags together and build the launch; raise :class:`FlagError`."""
    from aioelastic.agent._devices import (
        DeviceSettingError,
        check_numa_binding,
        check_virtual_local_rank,
    )
    from aioelastic.agent._site import worker_site_env
    from aioelastic.agent._spec import DEFAULT_LINE_PREFIX, LogSpec

    if args.module and args.no_python:
        raise FlagError("--module and --no-python cannot be combined")
    if args.preload and args.no_python:
        raise FlagError("--preload forks Python workers: it cannot be combined with --no-python")
    if args.preload and args.numa_binding is not None:
        raise FlagError("--preload cannot fork workers bound by numactl: drop --numa-binding")
    if args.spares and args.recovery != "in-place":
        raise FlagError("--spares needs --recovery in-place (spares wait in worker.worlds())")
    if args.metrics_port is not None and importlib.util.find_spec("prometheus_client") is None:
        raise FlagError("--metrics-port needs prometheus-client: pip install 'aioelastic[metrics]'")
    min_nodes, max_nodes = args.nnodes
    backend, endpoint, run_id = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id
    conf = dict(args.rdzv_conf)
    if args.standalone and args.nnodes != (1, 1):
        raise FlagError(
            f"--standalone runs a single node, but --nnodes asks for {args.nnodes[1]}; for a "
            "multi-node job drop --standalone, pass --rdzv-backend c10d --rdzv-endpoint HOST:PORT"
        )
    if args.standalone or implicit_standalone(args, backend, endpoint, conf):
        # one node: an in-process rendezvous needs no server (torchrun: c10d on localhost:0)
        run_id = str(uuid.uuid4()) if args.standalone or run_id == "none" else run_id
        backend, endpoint = "memory", f"standalone-{run_id}"
        min_nodes = max_nodes = 1
    if backend == "static":
        conf.setdefault("rank", str(args.node_rank))
        if not endpoint:
            endpoint = f"{args.master_addr}:{args.master_port or 29500}"
    if args.expose_torch_store and args.loopback_torch_store:
        raise FlagError("--expose-torch-store and --loopback-torch-store cannot be combined")
    env: dict[str, str] = {}
    if args.run_path:  # torchrun: --run-path wins over -m and --no-python
        entrypoint = os.environ.get("PYTHON_EXEC", sys.executable)
        prefix_args = ["-u", "-m", "aioelastic._run_path", args.training_script]
    elif args.no_python:
        entrypoint, prefix_args = args.training_script, []
    else:
        entrypoint = os.environ.get("PYTHON_EXEC", sys.executable)
        prefix_args = ["-u", *(["-m"] if args.module else []), args.training_script]
    if not args.no_python or args.run_path:
        env = worker_site_env(os.environ)
    if args.log_dir is not None:
        try:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FlagError(
                f"--log-dir {args.log_dir!r} is not a usable directory: {exc.strerror}"
            ) from None
    logs = LogSpec(
        log_dir=args.log_dir,
        redirects=args.redirects,
        tee=args.tee,
        local_ranks_filter=args.local_ranks_filter,
        line_prefix=os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", DEFAULT_LINE_PREFIX),
        inherit_console=True,  # torchrun's: a terminal stays the workers' own
        duplicate_stdout_filters=tuple(args.duplicate_stdout_filters),
        duplicate_stderr_filters=tuple(args.duplicate_stderr_filters),
    )
    nproc = resolve_nproc(args.nproc_per_node)
    if args.logs_specs is not None:
        logs = dataclasses.replace(logs, layout=logs_specs_layout(args.logs_specs, logs, nproc))
    try:
        if args.virtual_local_rank:
            check_virtual_local_rank(nproc, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if args.numa_binding is not None:
            check_numa_binding(args.numa_binding, nproc)
    except DeviceSettingError as exc:
        raise FlagError(str(exc)) from None
    return LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        run_id=run_id,
        rdzv_conf=conf,
        local_addr=args.local_addr,
        max_restarts=args.max_restarts,
        role=args.role,
        title=args.training_script,
        entrypoint=entrypoint,
        args=(*prefix_args, *args.training_script_args),
        logs=logs,
        signals=args.signals_to_handle,
        shutdown_timeout=args.shutdown_timeout,
        events_file=args.events_file,
        metrics_port=args.metrics_port,
        reap_core_dump=args.reap_core_dump,
        recovery=args.recovery,
        spares=args.spares,
        recovery_timeout=args.recovery_timeout,
        virtual_local_rank=args.virtual_local_rank,
        numa_binding=args.numa_binding,
        event_log_handler=args.event_log_handler,
        torch_store=(
            "expose"
            if args.expose_torch_store
            else "loopback"
            if args.loopback_torch_store
            else "auto"
        ),
        env=env,
        preemption_file=args.preemption_file,
        preload=args.preload,
        fork_template=args.fork_template,
    )


def signal_names(signals: Sequence[signal.Signals]) -> str:
    """``TORCHELASTIC_SIGNALS_TO_HANDLE`` as torchrun sets it: the names, comma-separated."""
    return ",".join(signum.name for signum in signals)


class ConsoleReporter:
    """Prints the agent's events as short ``[aioelastic +T]`` lines on stderr."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream
        self._start = time.monotonic()
        self._broken = False

    def __call__(self, event: AgentEvent) -> None:
        text = describe(event)
        if text is None or self._broken:
            return
        stream = self._stream or sys.stderr
        try:
            print(f"[aioelastic +{time.monotonic() - self._start:.2f}s] {text}", file=stream)
            stream.flush()
        except OSError:  # stderr went away (a closed pipe): the run goes on silently
            self._broken = True


def describe(event: AgentEvent) -> str | None:
    """A one-line human description of an agent event (None: not worth a line)."""
    from aioelastic.agent import _events as ev
    from aioelastic.agent._report import signal_name

    match event:
        case ev.RendezvousJoining():
            return f"joining rendezvous {event.run_id!r} ({event.backend})"
        case ev.RendezvousCompleted():
            return (
                f"rendezvous complete: node {event.group_rank} of {event.group_world_size}, "
                f"world size {event.world_size}, master {event.master_addr}:{event.master_port}"
            )
        case ev.LogDirectoryCreated():
            where = "a temporary directory, no --log-dir given" if event.temporary else "--log-dir"
            return f"worker logs in {event.path} ({where})"
        case ev.WorkersStarted():
            pids = " ".join(map(str, event.pids))
            return f"started {len(event.pids)} workers (restart {event.restart_count}): pids {pids}"
        case ev.WorkerReaped():
            return (
                f"watchdog: timer {event.scope_id!r} of rank {event.rank} (pid {event.pid}) "
                f"expired, sent {signal_name(event.signal)}"
            )
        case ev.StacksCaptured():
            report = event.report
            return f"watchdog: stacks before the reap: {report.summary} (in {report.directory})"
        case ev.WorkerFailed():
            return f"rank {event.failure.rank} failed: {event.failure.cause}"
        case ev.WorkersStopped():
            killed = f", {event.killed} needed SIGKILL" if event.killed else ""
            return f"stopped the worker group ({event.reason}{killed})"
        case ev.GroupRestarting():
            return f"restarting the worker group ({event.restart_count}/{event.max_restarts})"
        case ev.MembershipChanged():
            return f"membership changed ({event.reason.lower()}): re-rendezvous"
        case ev.GenerationAssigned():
            replaced = ", ".join(
                f"rank {r.rank} -> {'spare' if r.by_spare else 'new process'} pid {r.pid}"
                for r in event.replaced
            )
            extra = f"; {replaced}" if replaced and event.generation > 1 else ""
            return (
                f"generation {event.generation}: world size {event.world_size} "
                f"({event.reason}){extra}"
            )
        case ev.GenerationFormed():
            took = (
                ""
                if event.since_failure is None
                else f", {event.since_failure * 1000:.0f} ms after the failure"
            )
            return f"generation {event.generation} formed{took}"
        case ev.RecoveryFellBack():
            return f"in-place recovery fell back to a restart: {event.reason}"
        case ev.WorkerEvicted():
            return f"evicted rank {event.rank} (pid {event.pid}): {event.reason}"
        case ev.CollectivesAborted():
            return (
                f"rank {event.rank} (pid {event.pid}): abort of generation {event.generation}'s "
                f"collectives {event.outcome} ({event.detail})"
            )
        case ev.WorkerRestartedToLeave():
            return (
                f"restarting rank {event.rank} (pid {event.pid}) to leave generation "
                f"{event.generation}: {event.why.value} ({event.reason})"
            )
        case ev.SpareStarted():
            return f"started a spare worker: pid {event.pid}"
        case ev.TemplateReady() if not event.modules:
            return f"fork template started: pid {event.pid}, to import what the workers load"
        case ev.TemplateReady():
            return (
                f"fork template ready: pid {event.pid} preloaded {','.join(event.modules)} "
                f"in {event.seconds:.2f} s"
            )
        case ev.TemplateLearned():
            left_out = (
                f"; left out {len(event.left_out)} whose import starts a thread "
                f"({_some(event.left_out)})"
                if event.left_out
                else ""
            )
            return (
                f"fork template (pid {event.pid}) holds {len(event.modules)} module(s) the "
                f"workers loaded ({_some(event.modules)}), imported in {event.seconds:.2f} s"
                f"{left_out}: the next workers fork from it"
            )
        case ev.TemplateLost():
            then = (
                "restarting it; workers start plainly until it is ready"
                if event.restarting
                else "workers start plainly (importing their modules) from now on"
            )
            which = "fork template" if event.pid is None else f"fork template (pid {event.pid})"
            return f"{which} lost: {event.reason}; {then}"
        case ev.NodeFenced():
            return f"fenced: {event.detail}; killing the workers (SIGKILL) and joining again"
        case ev.ShutdownRequested():
            return f"received {signal_name(event.signal)}: stopping the workers"
        case ev.PreemptionNoticed():
            api = f"{len(event.api_ranks)} on the worker API"
            told = f"{len(event.signalled_ranks)} sent {signal_name(event.signal)}"
            return (
                f"job preempted by node {event.by_node} ({event.source}): local ranks: {api}, "
                f"{told}; deadline {event.timeout:g} s"
            )
        case ev.StopStepAgreed():
            return f"every rank stops at step {event.step} ({event.since_notice * 1000:.0f} ms)"
        case ev.RankSaved():
            return f"rank {event.rank} saved at step {event.step} ({event.since_notice:.2f} s)"
        case ev.PreemptionEnded():
            if event.no_boundary:
                ranks = ", ".join(map(str, event.no_boundary))
                return f"preemption: rank {ranks} reached no step boundary before the deadline"
            return None
        case ev.RunFinished() if event.result.state is ev.RunState.PREEMPTED:
            return f"run {event.result.reason}"
        case ev.RunFinished():
            result = event.result
            extra = f": {result.reason}" if result.reason else ""
            return f"run {result.state.value}{extra}"
    return None


ETCD_BACKENDS = ("etcd", "etcd-v3", "etcd-v2")
PROBE_TIMEOUT = 5.0
"""Seconds one etcd endpoint may take to accept a TCP connection at start-up."""


async def unreachable_etcd(endpoints: str) -> str | None:
    """Why no endpoint of ``endpoints`` accepts a TCP connection (None: one does).

    At start-up a refused connection on every member is a definite answer: fail at once
    rather than let the store retry for its read timeout.
    """
    from aioelastic.store._etcd_rpc import parse_endpoints

    addresses, _ = parse_endpoints(endpoints or "127.0.0.1:2379")
    reasons = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with anyio.fail_after(PROBE_TIMEOUT):
                stream = await anyio.connect_tcp(host.strip("[]"), int(port))
        except TimeoutError:
            reasons.append(f"{address}: no answer within {PROBE_TIMEOUT:g} s")
        except OSError as exc:  # anyio's "all attempts failed" carries the last one's reason
            cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
            reasons.append(f"{address}: {cause.strerror or cause}")
        else:
            await stream.aclose()
            return None
    return "; ".join(reasons)


def _some(modules: Sequence[str], shown: int = 4) -> str:
    """The first few top-level packages among ``modules``, for a log line."""
    packages = list(dict.fromkeys(name.partition(".")[0] for name in modules))
    more = f", and {len(packages) - shown} more" if len(packages) > shown else ""
    return ", ".join(packages[:shown]) + more


def print_event_line(record: EventRecord) -> None:
    """``--event-log-handler console``: every event as a JSON line on stderr."""
    from aioelastic.events import encode_record

    with suppress(OSError):
        print(encode_record(record), file=sys.stderr, flush=True)


class RootCauseRecorder:
    """Copies the root cause to the launcher's own ``TORCHELASTIC_ERROR_FILE``, as torchrun
    does, which is how a scheduler or an outer agent learns why the job failed.

    Subscribed to the agent: each failed worker's error file is read when the failure is
    reported (the files of a run without ``--log-dir`` go with the run). The root cause's
    document is copied with ``errorCode`` set to its exit status; a worker that left no file
    gets one saying how it ended (torchrun writes nothing then).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._documents: dict[int, Any] = {}

    def __call__(self, event: AgentEvent) -> None:
        from aioelastic.agent._events import WorkerFailed

        if isinstance(event, WorkerFailed):
            failure = event.failure
            with suppress(OSError, ValueError):  # none, or not JSON: described from the failure
                self._documents[failure.pid] = json.loads(Path(failure.error_file).read_bytes())

    def write(self, failures: Sequence[WorkerFailure]) -> None:
        """Write the root cause of ``failures`` (nothing when there are none)."""
        from aioelastic.agent._report import root_cause_first
        from aioelastic.errors import replace_json

        if not failures:
            return
        cause = root_cause_first(failures)[0]
        document = self._documents.get(cause.pid)
        if isinstance(document, dict) and isinstance(document.get("message"), dict):
            document["message"]["errorCode"] = cause.returncode
        elif document is None:
            described = f"rank {cause.rank} (local rank {cause.local_rank}): {cause.cause}"
            document = {
                "message": {
                    "message": described,
                    "extraInfo": {"py_callstack": "", "timestamp": str(int(cause.timestamp))},
                    "errorCode": cause.returncode,
                }
            }
        try:
            replace_json(self.path, document)
        except OSError as exc:
            print(
                f"{PROG}: cannot write TORCHELASTIC_ERROR_FILE {self.path}: {exc}", file=sys.stderr
            )


class SignalRouter:
    """Shutdown signals go to the agent once it exists; before that they end the launch."""

    def __init__(self) -> None:
        self.agent: ElasticAgent | None = None
        self.received: int | None = None
        self.early_exit = anyio.CancelScope()

    async def watch(
        self, signals: tuple[signal.Signals, ...], *, task_status: TaskStatus[None]
    ) -> None:
        with anyio.open_signal_receiver(*signals) as received:
            task_status.started()
            async for signum in received:
                if self.agent is not None:
                    self.agent.preempt(signum)
                else:
                    self.received = signum
                    self.early_exit.cancel()


async def launch(config: LaunchConfig) -> int:
    """Rendezvous, run the agent, print the failure report; return the exit status."""
    from aioelastic.agent._guardian import Guardian

    # Started first: the guardian's interpreter starts on another core while this one imports.
    async with Guardian(grace=config.shutdown_timeout) as guardian:
        return await _run(config, guardian)


async def _run(config: LaunchConfig, guardian: Guardian) -> int:
    from aioelastic._concurrency import unwrap_single_error
    from aioelastic._launcher.observe import observe
    from aioelastic._launcher.progress import watch_rendezvous
    from aioelastic.agent._agent import ElasticAgent
    from aioelastic.agent._errors import AgentError, WorkerSpecError
    from aioelastic.agent._report import format_report
    from aioelastic.agent._spec import ForensicsSpec, WorkerSpec
    from aioelastic.agent._timeouts import TimeoutConflictError
    from aioelastic.agent._worker_store import torch_store_arrangement
    from aioelastic.events import EventLogError
    from aioelastic.metrics import MetricsPortError
    from aioelastic.rendezvous import (
        RendezvousError,
        RendezvousParameterError,
        RendezvousParameters,
        get_rendezvous_handler,
    )
    from aioelastic.store import StoreError

    try:
        params = RendezvousParameters(
            backend=config.rdzv_backend,
            endpoint=config.rdzv_endpoint,
            run_id=config.run_id,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            local_addr=config.local_addr,
            **config.rdzv_conf,
        )
        handler_context = get_rendezvous_handler(params)
    except ValueError as exc:  # a bad backend name or option: the user's to fix
        one_line_error(f"--rdzv-backend/--rdzv-endpoint/--rdzv-conf: {exc}")
    if shutil.which(config.entrypoint) is None:  # --no-python's program, or PYTHON_EXEC
        one_line_error(f"the worker program {config.entrypoint!r} is not on PATH or not executable")
    if config.rdzv_backend in ETCD_BACKENDS:
        why = await unreachable_etcd(config.rdzv_endpoint)
        if why is not None:
            print(
                f"{PROG}: no etcd member is reachable ({why}); check --rdzv-endpoint",
                file=sys.stderr,
            )
            return 1
    observed = observe(  # failures go to the console once, by the agent's own reporter
        {}, events_file=config.events_file, metrics_port=config.metrics_port, log_warnings=False
    )
    router = SignalRouter()
    own_error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    recorder = RootCauseRecorder(own_error_file) if own_error_file else None
    result = None
    try:
        with unwrap_single_error(), anyio.CancelScope() as router.early_exit:
            async with anyio.create_task_group() as tg:
                await tg.start(router.watch, config.signals)
                async with (
                    observed as events,
                    handler_context as handler,
                    watch_rendezvous(handler, events, console=sys.stderr),
                ):
                    spec = WorkerSpec(
                        config.entrypoint,
                        handler,
                        args=config.args,
                        role=config.role,
                        local_world_size=config.nproc_per_node,
                        max_restarts=config.max_restarts,
                        shutdown_timeout=config.shutdown_timeout,
                        logs=config.logs,
                        forensics=ForensicsSpec(core_dump=config.reap_core_dump),
                        recovery=config.recovery,
                        spares=config.spares,
                        recovery_timeout=config.recovery_timeout,
                        virtual_local_rank=config.virtual_local_rank,
                        numa_binding=config.numa_binding,
                        torch_store=torch_store_arrangement(config.torch_store, params),
                        env={
                            **config.env,
                            "TORCHELASTIC_SIGNALS_TO_HANDLE": signal_names(config.signals),
                        },
                        preemption_file=config.preemption_file,
                        preload=config.preload,
                        fork_template=config.fork_template,
                    )
                    router.agent = ElasticAgent(
                        spec,
                        on_event=ConsoleReporter(),
                        on_watchdog_event=events.publisher("timer"),
                        guardian=guardian,
                    )
                    events.attach(router.agent, "agent")
                    if config.event_log_handler == "console":  # torch's: a StreamHandler
                        events.subscribe(print_event_line)
                    if recorder is not None:
                        router.agent.subscribe(recorder)
                    result = await router.agent.run()
                tg.cancel_scope.cancel()
    except (
        RendezvousParameterError,
        WorkerSpecError,
        TimeoutConflictError,
        EventLogError,
        MetricsPortError,
    ) as exc:
        one_line_error(str(exc))
    except (RendezvousError, AgentError, StoreError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if result is None:  # a signal came before any worker started
        signum = router.received or signal.SIGTERM
        message = f"{PROG}: stopped by {signal.Signals(signum).name} before any worker started"
        print(message, file=sys.stderr)
        return 128 + signum
    if result.failures:
        print(format_report(config.title, result.failures), file=sys.stderr)
        if recorder is not None:
            recorder.write(result.failures)
    return result.exit_status
