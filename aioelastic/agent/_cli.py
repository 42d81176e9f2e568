"""``aioelastic run``: torchrun's command line over :class:`~aioelastic.agent.ElasticAgent`.

Flags, defaults and ``PET_*`` environment variables follow torchrun where the concept is the
same. Values are checked while parsing, so a bad flag fails at once with one line naming it.
Nothing heavy is imported (no torch, no gRPC): a trivial job starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from aioelastic.agent._agent import ElasticAgent
    from aioelastic.agent._events import AgentEvent
    from aioelastic.agent._spec import LogSpec, Std

PROG = "aioelastic run"
_TRUE = {"1", "true", "yes", "on"}


class FlagError(Exception):
    """A flag's value is wrong; the message names the flag."""


def _one_line_error(message: str) -> NoReturn:
    print(f"{PROG}: error: {message} (see '{PROG} --help')", file=sys.stderr)
    raise SystemExit(2)


# -- value parsers (argparse ``type=``): each raises ArgumentTypeError with what is expected --


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` with ``0 < MIN <= MAX``."""
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"need 0 < MIN <= MAX, got {text!r}")
    return bounds


def parse_nproc(text: str) -> int | str:
    """A positive int, or ``cpu``, ``gpu``, ``auto`` (resolved when the job starts)."""
    if text in ("cpu", "gpu", "auto"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, cpu, gpu or auto, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """``key=value`` pairs separated by commas (values stay strings, as torch passes them)."""
    config: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected key=value pairs, got {item!r}")
        config[key.strip()] = value.strip()
    return config


def _non_negative(kind: Callable[[str], int | float]) -> Callable[[str], Any]:
    """A parser of finite numbers >= 0 of type ``kind``."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parse_port(text: str) -> int:
    """A TCP port, 0-65535."""
    value = _non_negative(int)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return int(value)


def parse_std(text: str) -> Std | dict[int, Std]:
    """torchrun's stream selector: 0-3, or per local rank ``0:3,1:2``."""
    from aioelastic.agent._spec import Std

    try:
        return Std.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_ranks(text: str) -> frozenset[int] | None:
    """Comma-separated local ranks (empty: all)."""
    if not text.strip():
        return None
    try:
        return frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 0,1,2, got {text!r}"
        ) from None


def parse_signals(text: str) -> tuple[signal.Signals, ...]:
    """Comma-separated signal names (``SIGTERM`` or ``TERM``)."""
    found = []
    for name in filter(None, (part.strip().upper() for part in text.split(","))):
        full = name if name.startswith("SIG") else f"SIG{name}"
        try:
            found.append(signal.Signals[full])
        except KeyError:
            raise argparse.ArgumentTypeError(f"{name!r} is not a signal name") from None
    return tuple(found)


# -- the parser ------------------------------------------------------------------------------


def _env_default(dest: str, default: Any) -> Any:
    """torchrun's ``PET_<DEST>`` convention: the environment overrides the built-in default."""
    return os.environ.get(f"PET_{dest.upper()}", default)


def _flag_default(dest: str) -> bool:
    return os.environ.get(f"PET_{dest.upper()}", "").lower() in _TRUE


def _spellings(names: tuple[str, ...]) -> tuple[str, list[str]]:
    """Return the dest of a flag and its spellings, adding torchrun's ``--snake_case`` ones."""
    long = next(n for n in names if n.startswith("--"))
    dest = long[2:].replace("-", "_")
    underscored = [f"--{dest}"] if "-" in long[2:] else []
    return dest, [*names, *underscored]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to the ``aioelastic`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="launch a job's workers on this node (torchrun-compatible)",
        description=(
            "Start NPROC_PER_NODE workers of TRAINING_SCRIPT on this node, keep them in one "
            "elastic group with the other nodes, restart them when one fails or hangs. "
            "Every flag can also be set as PET_<FLAG> (for example PET_NPROC_PER_NODE=4)."
        ),
        usage=f"{PROG} [options] TRAINING_SCRIPT [ARGS ...]",
    )
    parser.error = _one_line_error  # type: ignore[method-assign]  # one line, no usage dump
    add = parser.add_argument

    def option(*names: str, default: Any, **kwargs: Any) -> None:
        dest, spellings = _spellings(names)
        add(*spellings, dest=dest, default=_env_default(dest, default), **kwargs)

    def flag(*names: str, help: str) -> None:
        dest, spellings = _spellings(names)
        add(*spellings, dest=dest, action="store_true", default=_flag_default(dest), help=help)

    option("--nnodes", default="1:1", type=parse_nnodes, help="N or MIN:MAX nodes")
    option(
        "--nproc-per-node",
        default="1",
        type=parse_nproc,
        help="workers per node: an integer, cpu, gpu or auto",
    )
    option("--rdzv-backend", default="static", help="static, c10d, etcd, etcd-v3 or memory")
    option("--rdzv-endpoint", default="", help="HOST:PORT of the rendezvous store")
    option("--rdzv-id", default="none", help="the job id shared by all nodes")
    option(
        "--rdzv-conf",
        default="",
        type=parse_rdzv_conf,
        help="rendezvous options, key=value,... (join_timeout, last_call_timeout, ...)",
    )
    flag(
        "--standalone",
        help="single-node job with a private in-process rendezvous; ignores the --rdzv-* flags",
    )
    option(
        "--max-restarts",
        default="0",
        type=_non_negative(int),
        help="restarts of the worker group allowed before the job fails",
    )
    option(
        "--monitor-interval",
        default="0.1",
        type=_non_negative(float),
        help="accepted for torchrun compatibility; exits are seen at once, not polled",
    )
    option(
        "--start-method",
        default="spawn",
        choices=("spawn", "fork", "forkserver"),
        help="accepted for torchrun compatibility; workers are always new processes",
    )
    option("--role", default="default", help="the workers' role name")
    flag("-m", "--module", help="run TRAINING_SCRIPT as a module (python -m)")
    flag("--no-python", help="run TRAINING_SCRIPT directly, not through python")
    flag("--run-path", help="accepted for torchrun compatibility (scripts always run by path)")
    option("--log-dir", default=None, help="directory for worker log and error files")
    option(
        "-r",
        "--redirects",
        default="0",
        type=parse_std,
        help="send streams to files in --log-dir instead of the console: 0-3 or 0:1,1:2",
    )
    option(
        "-t",
        "--tee",
        default="0",
        type=parse_std,
        help="send streams to the console and to files in --log-dir: 0-3 or 0:1,1:2",
    )
    option(
        "--local-ranks-filter",
        default="",
        type=parse_ranks,
        help="only show these local ranks' output on the console (comma-separated)",
    )
    option("--node-rank", default="0", type=_non_negative(int), help="this node's rank (static)")
    option("--master-addr", default="127.0.0.1", help="rank 0's address (static rendezvous)")
    option("--master-port", default=None, type=parse_port, help="rank 0's port (static)")
    option("--local-addr", default=None, help="this node's address as others reach it")
    option(
        "--signals-to-handle",
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        type=parse_signals,
        help="signals forwarded to the workers before stopping",
    )
    option(
        "--shutdown-timeout",
        default=os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"),
        type=_non_negative(float),
        help="seconds between the forwarded signal and SIGKILL",
    )
    option("--events-file", default=None, help="append every event to this file as JSON lines")
    option(
        "--metrics-port",
        default=None,
        type=parse_port,
        help="serve Prometheus metrics on this port (needs aioelastic[metrics]; 0: any free)",
    )
    add("training_script", metavar="TRAINING_SCRIPT", help="the worker program")
    add("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    parser.set_defaults(handler=run_command)
    return parser


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


def resolve_nproc(value: int | str) -> int:
    """Turn ``cpu``/``gpu``/``auto`` into a count (torch is imported only for gpu/auto)."""
    if isinstance(value, int):
        return value
    if value == "cpu":
        return os.cpu_count() or 1
    try:
        import torch  # only when asked for GPUs
    except ImportError:
        if value == "gpu":
            raise FlagError("--nproc-per-node gpu needs torch installed") from None
        return os.cpu_count() or 1
    count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    if count:
        return count
    if value == "gpu":
        raise FlagError("--nproc-per-node gpu: no CUDA device is available")
    return os.cpu_count() or 1


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Check the flags together and build the launch; raise :class:`FlagError`."""
    from aioelastic.agent._spec import DEFAULT_LINE_PREFIX, LogSpec

    if args.module and args.no_python:
        raise FlagError("--module and --no-python cannot be combined")
    if args.metrics_port is not None and importlib.util.find_spec("prometheus_client") is None:
        raise FlagError("--metrics-port needs prometheus-client: pip install 'aioelastic[metrics]'")
    min_nodes, max_nodes = args.nnodes
    backend, endpoint, run_id = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id
    conf = dict(args.rdzv_conf)
    if args.standalone:  # one node: an in-process rendezvous needs no server (torchrun: c10d)
        run_id = str(uuid.uuid4())
        backend, endpoint = "memory", f"standalone-{run_id}"
        min_nodes = max_nodes = 1
    if backend == "static":
        conf.setdefault("rank", str(args.node_rank))
        if not endpoint:
            endpoint = f"{args.master_addr}:{args.master_port or 29500}"
    if args.no_python:
        entrypoint, prefix_args = args.training_script, []
    else:
        entrypoint = os.environ.get("PYTHON_EXEC", sys.executable)
        prefix_args = ["-u", *(["-m"] if args.module else []), args.training_script]
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
    )
    return LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=resolve_nproc(args.nproc_per_node),
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
    )


def run_command(args: argparse.Namespace) -> int:
    """The ``aioelastic run`` handler: parse, launch on asyncio (uvloop when installed)."""
    try:
        config = config_from_args(args)
    except FlagError as exc:
        _one_line_error(str(exc))
    import importlib.util
    import logging

    level = os.environ.get("LOGLEVEL", "WARNING").upper()  # torchrun's variable
    if not isinstance(logging.getLevelName(level), int):
        _one_line_error(f"LOGLEVEL={level!r} is not a logging level (DEBUG, INFO, WARNING, ...)")
    logging.basicConfig(level=level, format="[%(name)s] %(message)s")
    use_uvloop = importlib.util.find_spec("uvloop") is not None
    return anyio.run(launch, config, backend_options={"use_uvloop": use_uvloop})


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
        case ev.WorkersStarted():
            pids = " ".join(map(str, event.pids))
            return f"started {len(event.pids)} workers (restart {event.restart_count}): pids {pids}"
        case ev.WorkerReaped():
            return (
                f"watchdog: timer {event.scope_id!r} of rank {event.rank} (pid {event.pid}) "
                f"expired, sent {signal_name(event.signal)}"
            )
        case ev.WorkerFailed():
            return f"rank {event.failure.rank} failed: {event.failure.cause}"
        case ev.WorkersStopped():
            killed = f", {event.killed} needed SIGKILL" if event.killed else ""
            return f"stopped the worker group ({event.reason}{killed})"
        case ev.GroupRestarting():
            return f"restarting the worker group ({event.restart_count}/{event.max_restarts})"
        case ev.MembershipChanged():
            return f"membership changed ({event.reason.lower()}): re-rendezvous"
        case ev.ShutdownRequested():
            return f"received {signal_name(event.signal)}: stopping the workers"
        case ev.RunFinished():
            result = event.result
            extra = f": {result.reason}" if result.reason else ""
            return f"run {result.state.value}{extra}"
    return None


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
                    self.agent.request_stop(signum)
                else:
                    self.received = signum
                    self.early_exit.cancel()


async def launch(config: LaunchConfig) -> int:
    """Rendezvous, run the agent, print the failure report; return the exit status."""
    from aioelastic.agent._agent import ElasticAgent
    from aioelastic.agent._errors import AgentError, WorkerSpecError
    from aioelastic.agent._group import unwrap_single_error
    from aioelastic.agent._report import format_report
    from aioelastic.agent._spec import WorkerSpec
    from aioelastic.events import EventLogError, observe
    from aioelastic.metrics import MetricsPortError
    from aioelastic.rendezvous import (
        RendezvousError,
        RendezvousParameterError,
        RendezvousParameters,
        get_rendezvous_handler,
    )

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
        _one_line_error(f"--rdzv-backend/--rdzv-conf: {exc}")
    observed = observe({}, events_file=config.events_file, metrics_port=config.metrics_port)
    router = SignalRouter()
    result = None
    try:
        with unwrap_single_error(), anyio.CancelScope() as router.early_exit:
            async with anyio.create_task_group() as tg:
                await tg.start(router.watch, config.signals)
                async with observed as events, handler_context as handler:
                    spec = WorkerSpec(
                        config.entrypoint,
                        handler,
                        args=config.args,
                        role=config.role,
                        local_world_size=config.nproc_per_node,
                        max_restarts=config.max_restarts,
                        shutdown_timeout=config.shutdown_timeout,
                        logs=config.logs,
                    )
                    router.agent = ElasticAgent(spec, on_event=ConsoleReporter())
                    events.attach(router.agent, "agent")
                    result = await router.agent.run()
                tg.cancel_scope.cancel()
    except (RendezvousParameterError, WorkerSpecError, EventLogError, MetricsPortError) as exc:
        _one_line_error(str(exc))
    except (RendezvousError, AgentError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if result is None:  # a signal came before any worker started
        signum = router.received or signal.SIGTERM
        message = f"{PROG}: stopped by {signal.Signals(signum).name} before any worker started"
        print(message, file=sys.stderr)
        return 128 + signum
    if result.failures:
        print(format_report(config.title, result.failures), file=sys.stderr)
    return result.exit_status
