"""What the agent runs: :class:`WorkerSpec` (the workers of one role on this node) and
:class:`LogSpec` (where their output goes), with torchrun's ``Std`` stream selectors."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aioelastic.agent._errors import WorkerSpecError

if TYPE_CHECKING:
    from aioelastic.rendezvous import RendezvousHandler

RECOVERY_MODES = ("restart", "in-place")
TORCH_STORE_MODES = ("loopback", "expose")
FORK_TEMPLATE_MODES = ("auto", "off")
"""What a worker's failure costs: a restart of the group, or only that worker's replacement."""

DEFAULT_LINE_PREFIX = "[${rank}]: "
"""Console line prefix template; ``${rank}``, ``${local_rank}`` and ``${role_name}`` expand."""


class Std(enum.IntFlag):
    """Which of a worker's standard streams an option applies to (torchrun's 0-3 values)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def parse(cls, text: str) -> Std | dict[int, Std]:
        """Parse ``"3"`` (every local rank) or ``"0:1,1:2"`` (per local rank), as torchrun does."""
        text = text.strip()

        def one(value: str) -> Std:
            number = int(value)
            if not 0 <= number <= 3:
                raise ValueError(number)
            return cls(number)

        try:
            if ":" not in text:
                return one(text or "0")
            per_rank: dict[int, Std] = {}
            for item in text.split(","):
                rank, _, value = item.partition(":")
                per_rank[int(rank)] = one(value)
        except ValueError:
            raise ValueError(
                f"{text!r} is not a stream selector: use 0 (none), 1 (stdout), 2 (stderr), "
                "3 (both), or per local rank like 0:3,1:2"
            ) from None
        return per_rank


def std_for(selector: Std | Mapping[int, Std], local_rank: int) -> Std:
    """Return the streams ``selector`` picks for ``local_rank``."""
    if isinstance(selector, Std):
        return selector
    return selector.get(local_rank, Std.NONE)


@dataclass(frozen=True, slots=True)
class LogSpec:
    """Where workers' output goes.

    By default every line reaches the agent's console prefixed with its rank, and stdin is
    ``/dev/null``. With ``inherit_console`` (``aioelastic run``'s, torchrun's behaviour) workers
    share the agent's terminal: its stdin, and its stdout/stderr for each stream that goes only
    to the console (unprefixed). ``redirects`` sends streams to files under ``log_dir``
    instead; ``tee`` sends them to both (prefixed on the console). Ranks outside
    ``local_ranks_filter`` (when given) stay off the console. ``line_prefix`` is a template
    (``${rank}``, ``${local_rank}``, ``${role_name}``); an empty prefix also lets workers write
    to the console directly.
    """

    log_dir: str | None = None
    redirects: Std | Mapping[int, Std] = Std.NONE
    tee: Std | Mapping[int, Std] = Std.NONE
    local_ranks_filter: frozenset[int] | None = None
    line_prefix: str = DEFAULT_LINE_PREFIX
    inherit_console: bool = False
    duplicate_stdout_filters: tuple[str, ...] = ()
    """Tee'd stdout lines containing any of these also go to ``filtered_stdout.log``."""
    duplicate_stderr_filters: tuple[str, ...] = ()
    """The same for stderr (``filtered_stderr.log``)."""
    layout: Callable[[Mapping[int, Mapping[str, str]]], Mapping[int, Any]] | None = None
    """Decides, once per attempt, each local rank's streams and error file instead (a torch
    ``LogsSpecs`` from ``--logs-specs``: see ``aioelastic/_launcher/torch_logs.py``)."""

    def wants_files(self, local_world_size: int) -> bool:
        """Return whether any local rank sends a stream to a file of ours (not a layout's)."""
        return self.layout is None and any(
            std_for(self.redirects, r) | std_for(self.tee, r) for r in range(local_world_size)
        )


@dataclass(frozen=True, slots=True)
class ForensicsSpec:
    """What the agent captures from a hung worker before the watchdog reaps it.

    ``stacks``: every thread's Python stack of every local rank (py-spy at ``py_spy``, found
    next to the interpreter or on ``PATH`` when ``"auto"``, None for none; else the worker's
    faulthandler signal). ``core_dump``: also a native core (gdb's ``gcore``). All of it within
    ``hook_timeout`` seconds (default 5, 30 with core dumps); across nodes the reap then waits,
    as long again at most, for the round's other nodes to report theirs; it follows regardless.
    """

    stacks: bool = True
    core_dump: bool = False
    hook_timeout: float | None = None
    py_spy: str | None = "auto"

    @property
    def timeout(self) -> float:
        """The bound on a capture, in seconds."""
        if self.hook_timeout is not None:
            return self.hook_timeout
        return 30.0 if self.core_dump else 5.0

    @property
    def reap_bound(self) -> float:
        """The longest a reap waits for forensics: a capture, then the other nodes' reports."""
        return 2 * self.timeout


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """The workers one agent runs on its node, and how it looks after them.

    ``entrypoint`` and ``args`` form each worker's command line (for a Python script:
    ``entrypoint=sys.executable, args=("-u", "train.py", ...)``). ``env`` is added to the
    agent's own environment. ``watchdog=None`` follows ``TORCHELASTIC_ENABLE_FILE_TIMER``
    (on unless it is ``0``); ``forensics`` says what is captured before it reaps a worker.
    ``shutdown_timeout`` is how long stopping workers waits after the polite signal before
    SIGKILL. ``recovery="in-place"`` replaces only a failed worker (by one of ``spares`` warm
    spares when there is one) and moves the others to the next generation of the world, for
    workers that use :mod:`aioelastic.worker`; a generation that does not form within
    ``recovery_timeout`` seconds costs a restart as with ``recovery="restart"``.
    """

    entrypoint: str
    rdzv_handler: RendezvousHandler
    args: tuple[str, ...] = ()
    role: str = "default"
    local_world_size: int = 1
    max_restarts: int = 3
    env: Mapping[str, str] = field(default_factory=dict)
    watchdog: bool | None = None
    shutdown_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    logs: LogSpec = field(default_factory=LogSpec)
    virtual_local_rank: bool = False
    """Each worker sees ``LOCAL_RANK=0`` and only its own GPU (torchrun's flag of that name)."""
    numa_binding: str | None = None
    """Bind each worker to the CPUs near its GPU: node, socket, exclusive or core-complex."""
    forensics: ForensicsSpec = field(default_factory=ForensicsSpec)
    recovery: str = "restart"
    spares: int = 0
    recovery_timeout: float = 60.0
    torch_store: str = "loopback"
    """Where workers find torch's store: ``loopback`` (each agent serves its own workers) or
    ``expose`` (torchrun's arrangement: the hosting agent serves it on the network)."""
    preemption_file: str | None = None
    """A path a scheduler writes as its preemption notice: its appearing preempts the job as a
    shutdown signal does (``--preemption-file``)."""
    preload: tuple[str, ...] = ()
    """Modules a fork template imports once per node; workers are then its forks (``--preload``,
    see ``_template.py``). Needs a Python entrypoint."""
    fork_template: str = "auto"
    """``auto``: the agent learns what its workers load and a fork template imports it, so
    that the later starts (restart, replacement, spare) fork from a warm process; a worker
    that cannot be forked (not ``python script``/``-m module``, or bound by numactl) always
    starts plainly. ``off``: only ``preload`` makes a template (``--fork-template``)."""

    def __post_init__(self) -> None:
        if self.recovery not in RECOVERY_MODES:
            raise WorkerSpecError("recovery", self.recovery, "must be 'restart' or 'in-place'")
        if self.spares < 0:
            raise WorkerSpecError("spares", self.spares, "must be >= 0")
        if self.spares and self.recovery != "in-place":
            raise WorkerSpecError("spares", self.spares, "spares need recovery='in-place'")
        if not (math.isfinite(self.recovery_timeout) and self.recovery_timeout > 0):
            raise WorkerSpecError(
                "recovery_timeout", self.recovery_timeout, "must be a positive number of seconds"
            )
        if self.torch_store not in TORCH_STORE_MODES:
            raise WorkerSpecError("torch_store", self.torch_store, "must be 'loopback' or 'expose'")
        if not self.entrypoint:
            raise WorkerSpecError("entrypoint", self.entrypoint, "name the program to run")
        if self.local_world_size < 1:
            raise WorkerSpecError("local_world_size", self.local_world_size, "must be >= 1")
        if self.max_restarts < 0:
            raise WorkerSpecError("max_restarts", self.max_restarts, "must be >= 0")
        for name in ("shutdown_timeout", "exit_barrier_timeout"):
            value = getattr(self, name)
            if math.isnan(value) or value < 0:
                raise WorkerSpecError(name, value, "must be a non-negative number of seconds")
        if not self.role:
            raise WorkerSpecError("role", self.role, "must be a non-empty name")
        if self.fork_template not in FORK_TEMPLATE_MODES:
            raise WorkerSpecError("fork_template", self.fork_template, "must be 'auto' or 'off'")
        if self.preload:
            self._check_preload()

    def _check_preload(self) -> None:
        from aioelastic.agent._template_codec import check_module_names
        from aioelastic.agent._template_command import python_command

        try:
            check_module_names(self.preload)
            python_command(self.argv)
        except ValueError as exc:
            raise WorkerSpecError("preload", ",".join(self.preload), str(exc)) from None
        if self.numa_binding is not None:
            raise WorkerSpecError(
                "preload",
                ",".join(self.preload),
                "workers bound with numactl (numa_binding) cannot be forked: drop one of them",
            )

    @property
    def argv(self) -> list[str]:
        """The command line each worker runs."""
        return [self.entrypoint, *self.args]
