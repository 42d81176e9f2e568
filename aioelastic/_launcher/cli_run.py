"""``aioelastic run``: torchrun's command line over :class:`~aioelastic.agent.ElasticAgent`.

Flags, defaults and ``PET_*`` environment variables follow torchrun where the concept is the
same. Values are checked while parsing, so a bad flag fails at once with one line naming it.
Nothing heavy is imported (no torch, no gRPC): a trivial job starts in a fraction of a second.
The launch itself (flags to a :class:`LaunchConfig`, the agent, the console) is in
``launch.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from aioelastic._launcher.launch import PROG, FlagError, config_from_args, launch, one_line_error
from aioelastic.agent._devices import NUMA_MODES

if TYPE_CHECKING:
    from aioelastic.agent._spec import Std

_TRUE = {"1", "true", "yes", "on"}


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
    """A positive int, or ``cpu``, ``gpu``, ``xpu``, ``auto`` (resolved when the job starts)."""
    if text in ("cpu", "gpu", "xpu", "auto"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, cpu, gpu, xpu or auto, got {text!r}"
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


def _module_list(text: str) -> tuple[str, ...]:
    """Comma-separated module names (``torch,my_model``); empty for none."""
    from aioelastic.agent._template_codec import check_module_names

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    try:
        return check_module_names(names)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    value = float(_non_negative(float)(text))
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


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


def parse_filters(text: str) -> list[str]:
    """torchrun's filter list: comma-separated strings, ``,,`` standing for a comma."""
    placeholder = "\0"
    items = text.replace(",,", placeholder).split(",")
    return [item.replace(placeholder, ",") for item in items if item]


def _one_of(*names: str) -> Callable[[str], str]:
    """A parser accepting exactly ``names`` (checks ``PET_*`` values too, unlike choices=)."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got {text!r}")
        return text

    parse.__name__ = "choice"
    return parse


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
    parser.error = one_line_error  # type: ignore[method-assign]  # one line, no usage dump
    add = parser.add_argument

    pet_names: list[str] = []  # the PET_* variables the flags read

    def option(*names: str, default: Any, **kwargs: Any) -> None:
        dest, spellings = _spellings(names)
        pet_names.append(f"PET_{dest.upper()}")
        add(*spellings, dest=dest, default=_env_default(dest, default), **kwargs)

    def flag(*names: str, help: str) -> None:
        dest, spellings = _spellings(names)
        pet_names.append(f"PET_{dest.upper()}")
        add(*spellings, dest=dest, action="store_true", default=_flag_default(dest), help=help)

    option("--nnodes", default="1:1", type=parse_nnodes, help="N or MIN:MAX nodes")
    option(
        "--nproc-per-node",
        default="1",
        type=parse_nproc,
        help="workers per node: an integer, cpu, gpu, xpu or auto (cpu: the usable CPUs)",
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
        help="single-node job with a private in-process rendezvous (--rdzv-backend, "
        "--rdzv-endpoint and --rdzv-id are ignored)",
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
    flag(
        "--run-path",
        help="run TRAINING_SCRIPT with runpy.run_path; an uncaught exception is recorded "
        "for the failure report without @record",
    )
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
        help="signals that preempt the job while workers run: workers on the worker API stop "
        "at one agreed step (world.should_stop), the others get the signal, on every node",
    )
    option(
        "--shutdown-timeout",
        default=os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"),
        type=_non_negative(float),
        help="seconds between the signal and SIGKILL, counted for the whole job on every node "
        "(fractions allowed, on purpose: torchrun takes whole seconds, every one of which "
        "works here too)",
    )
    option(
        "--preemption-file",
        default=None,
        metavar="PATH",
        help="a file the scheduler writes as its preemption notice: when it appears, the job is "
        "preempted as by SIGTERM",
    )
    flag(
        "--reap-core-dump",
        help="before the watchdog reaps a hung worker, also write its native core dump "
        "(gdb's gcore) next to its stacks in --log-dir",
    )
    option("--events-file", default=None, help="append every event to this file as JSON lines")
    option(
        "--metrics-port",
        default=None,
        type=parse_port,
        help="serve Prometheus metrics on this port (needs aioelastic[metrics]; 0: any free)",
    )
    option(
        "--recovery",
        default="restart",
        choices=("restart", "in-place"),
        help="what a worker's failure costs: restart the group, or (in-place) replace only that "
        "worker while the others go on in the next generation (workers use aioelastic.worker)",
    )
    option(
        "--spares",
        default="0",
        type=_non_negative(int),
        help="warm spare workers per node that wait in worker.worlds() (--recovery in-place)",
    )
    option(
        "--recovery-timeout",
        default="60",
        type=_positive_seconds,
        help="seconds a new generation may take to form before a full restart",
    )
    option(
        "--preload",
        default="",
        type=_module_list,
        metavar="MODULE[,MODULE...]",
        help="import these modules once per node in a fork template; every worker (start, "
        "restart, replacement, spare) is a fork of it and imports nothing again",
    )
    option(
        "--fork-template",
        default="auto",
        type=_one_of("auto", "off"),
        help="auto: a fork template per node imports what the workers load (learned while they "
        "run), and later starts (restart, replacement, spare) fork from it, the first start "
        "staying a plain one as torchrun's; off: every worker starts plainly unless --preload",
    )
    # torchrun 2.13's newer flags
    option(
        "--event-log-handler",
        default="null",
        type=_one_of("null", "console", "dynamic_rendezvous"),
        help="torch's event log handler names: console prints every event as a JSON line on "
        "stderr; null and dynamic_rendezvous print none (see --events-file)",
    )
    option(
        "--logs-specs",
        default=None,
        help="a torchrun.logs_specs entry point: its torch LogsSpecs class decides where each "
        "worker's streams and error file go",
    )
    option(
        "--numa-binding",
        default=None,
        type=_one_of(*NUMA_MODES),
        help="bind each worker to the CPUs near its GPU (node, socket, exclusive, core-complex; "
        "needs a CUDA device per worker and numactl)",
    )
    flag(
        "--virtual-local-rank",
        help="LOCAL_RANK=0 for every worker, each seeing only its own GPU as device 0 "
        "(CUDA_VISIBLE_DEVICES)",
    )
    for stream in ("stdout", "stderr"):
        option(
            f"--duplicate-{stream}-filters",
            default="",
            type=parse_filters,
            help=f"copy tee'd {stream} lines containing any of these comma-separated strings "
            f"(,, for a comma) to filtered_{stream}.log in the attempt's log directory",
        )
    flag(
        "--expose-torch-store",
        help="torchrun's store arrangement: the hosting agent serves torch's store protocol on "
        "the network and workers get its address (static: exactly --master-addr/--master-port); "
        "anyone who reaches that port can read and write every key. The default where the "
        "job's store has no token and no TLS and the job has more than one node",
    )
    flag(
        "--loopback-torch-store",
        help="each agent serves torch's store protocol to its own workers on 127.0.0.1, relayed "
        "to the job's store (workers get MASTER_ADDR=127.0.0.1 and that port). The default "
        "where a token or TLS protects the job's store, and for --standalone",
    )
    add("training_script", metavar="TRAINING_SCRIPT", help="the worker program")
    remainder = add(
        "training_script_args", metavar="ARGS", nargs=argparse.REMAINDER, help="its arguments"
    )
    remainder.required = False  # a script without arguments lacks nothing
    parser.set_defaults(handler=run_command, pet_names=frozenset(pet_names))
    return parser


NO_EFFECT = {
    "PET_MONITOR_INTERVAL": "worker exits are seen at once through pidfds, not polled",
    "PET_START_METHOD": "workers are always started as new processes",
}
"""torchrun variables of flags accepted for compatibility that change nothing here."""


def unknown_pet_variables(environ: Mapping[str, str], known: frozenset[str]) -> list[str]:
    """The ``PET_*`` variables of ``environ`` that no flag reads, sorted."""
    return sorted(name for name in environ if name.startswith("PET_") and name not in known)


def missing_script(args: argparse.Namespace) -> str | None:
    """Why the workers could not open TRAINING_SCRIPT (None: it is there, or it is a module or
    a program, which only starting it can tell)."""
    if args.module or args.no_python:
        return None
    script = args.training_script
    if os.path.exists(script):  # a file, or a directory or zip with __main__.py
        return None
    where = "" if os.path.isabs(script) else f" in {os.getcwd()}"
    return f"the training script {script!r} does not exist{where}"


def run_command(args: argparse.Namespace) -> int:
    """The ``aioelastic run`` handler: parse, launch on asyncio (uvloop when installed)."""
    for name in unknown_pet_variables(os.environ, args.pet_names):
        flag_name = "--" + name[4:].lower().replace("_", "-")
        print(f"{PROG}: warning: {name} is ignored: {flag_name} is not a flag", file=sys.stderr)
    for name, why in NO_EFFECT.items():
        if name in os.environ:
            print(f"{PROG}: warning: {name} has no effect: {why}", file=sys.stderr)
    missing = missing_script(args)
    if missing is not None:
        one_line_error(missing)
    try:
        config = config_from_args(args)
    except FlagError as exc:
        one_line_error(str(exc))
    level = os.environ.get("LOGLEVEL", "WARNING").upper()  # torchrun's variable
    if not isinstance(logging.getLevelName(level), int):
        one_line_error(f"LOGLEVEL={level!r} is not a logging level (DEBUG, INFO, WARNING, ...)")
    logging.basicConfig(level=level, format="[%(name)s] %(message)s")
    use_uvloop = importlib.util.find_spec("uvloop") is not None
    return anyio.run(launch, config, backend_options={"use_uvloop": use_uvloop})
