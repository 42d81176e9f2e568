"""What an agent reports: typed events, the final result and a statistics snapshot.

The agent (``aioelastic.agent``, which re-exports the public ones) emits them; the event log,
the timeline, the goodput report and the metrics read them without importing the agent.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from aioelastic._kinds.failures import HangReport, WorkerFailure
from aioelastic._subscribers import WarningEvent


class RunState(enum.StrEnum):
    """How a run ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    """A shutdown signal stopped the run."""
    PREEMPTED = "preempted"
    """A node of the job was preempted: the ranks stopped at an agreed step (``_preemption.py``)."""


class EvictCause(enum.Enum):
    """Why in-place recovery takes out a member that still runs."""

    HUNG = "taken for hung"
    """Most members' collectives failed while it answered nothing."""
    ABORT_UNAVAILABLE = "abort unavailable"
    """Its world ended and it cannot abort its collectives (a backend without abort)."""
    DID_NOT_LEAVE = "did not leave"
    """Its world ended and it did not enter the next one in time."""


@dataclass(frozen=True, slots=True)
class RankStepTime:
    """One rank's step time in a straggler window: the median of its samples, and its score."""

    rank: int
    median: float
    score: float
    samples: int


@dataclass(frozen=True, slots=True)
class RendezvousJoining:
    """The agent is joining a rendezvous round (it may wait there for other nodes)."""

    run_id: str
    backend: str
    restart_count: int


@dataclass(frozen=True, slots=True)
class RendezvousCompleted:
    """This node joined a round: its group rank, the node count and the workers' world size."""

    group_rank: int
    group_world_size: int
    world_size: int
    master_addr: str
    master_port: int


@dataclass(frozen=True, slots=True)
class LogDirectoryCreated:
    """Worker log files of this run go under ``path`` (``temporary``: no log dir was given)."""

    path: str
    temporary: bool


@dataclass(frozen=True, slots=True)
class WorkersStarted:
    """The local worker group started; ``ranks`` and ``pids`` are in local-rank order."""

    restart_count: int
    ranks: tuple[int, ...]
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkerSucceeded:
    """A worker exited with status 0."""

    local_rank: int
    rank: int
    pid: int


@dataclass(frozen=True, slots=True)
class WorkerFailed(WarningEvent):
    """A worker failed (non-zero exit, a signal, or a watchdog reap)."""

    failure: WorkerFailure


@dataclass(frozen=True, slots=True)
class WorkerReaped(WarningEvent):
    """The watchdog signalled a worker whose timer ``scope_id`` expired."""

    local_rank: int
    rank: int
    pid: int
    scope_id: str
    signal: int


@dataclass(frozen=True, slots=True)
class StacksCaptured(WarningEvent):
    """Before reaping, the agent captured its workers' stacks (``report.stacks`` says how, or
    why not, for each rank) and grouped them with other nodes' (``report.summary``)."""

    report: HangReport


@dataclass(frozen=True, slots=True)
class TimeoutsLearnedIn:
    """Workers' ``expires(after="auto")`` keep what they learn in ``directory``
    (``aioelastic.timer.learned_limits(directory)`` reads it; the metrics serve it)."""

    directory: str


@dataclass(frozen=True, slots=True)
class MembershipChanged(WarningEvent):
    """The rendezvous round became invalid; the group stops and re-rendezvouses for free."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class NodeFenced(WarningEvent):
    """This node could not renew its liveness in time, so others may already hold its ranks:
    its workers are killed at once (SIGKILL) and it joins again."""

    detail: str


@dataclass(frozen=True, slots=True)
class WorkersStopped:
    """The local group was stopped by the agent; ``killed`` counts workers that needed SIGKILL."""

    reason: str
    signal: int
    killed: int


@dataclass(frozen=True, slots=True)
class GroupRestarting:
    """A failure costs a restart: the group starts again after re-rendezvous."""

    restart_count: int
    max_restarts: int


@dataclass(frozen=True, slots=True)
class ShutdownRequested(WarningEvent):
    """The agent received a shutdown signal."""

    signal: int


@dataclass(frozen=True, slots=True)
class PreemptionNoticed(WarningEvent):
    """The job is preempted: node ``by_node`` got ``signal`` (``source``: ``signal`` or
    ``file``); this node (``node``) stops its ranks at the agreed step within ``timeout`` s."""

    by_node: int
    node: int
    signal: int
    source: str
    timeout: float
    api_ranks: tuple[int, ...]
    """Local ranks on the worker API: told, and they stop at the agreed step."""
    signalled_ranks: tuple[int, ...]
    """Local ranks not on the API: ``signal`` was forwarded to them."""


@dataclass(frozen=True, slots=True)
class StopStepAgreed:
    """Every rank of the job stops at ``step``; ``since_notice``: seconds since this node knew."""

    step: int
    since_notice: float


@dataclass(frozen=True, slots=True)
class RankSaved:
    """A rank that stopped at ``step`` (``should_stop`` said True) returned: it saved."""

    rank: int
    local_rank: int
    pid: int
    step: int
    since_notice: float


@dataclass(frozen=True, slots=True)
class PreemptionEnded:
    """This node's part of a preemption is over.

    ``saved``: ranks that stopped at ``step`` and returned; ``no_boundary``: ranks on the API
    that reached no step boundary before the deadline; ``unsaved``: ranks that stopped but did
    not return in time (or failed); ``signalled``: ranks not on the API, with their exit status.
    ``since_notice``: seconds from the notice on this node until its last worker exited (saved);
    ``all_stopping``: until its last rank on the API was told to stop (None: not all were).
    """

    step: int | None
    saved: tuple[int, ...]
    no_boundary: tuple[int, ...]
    unsaved: tuple[int, ...]
    signalled: tuple[tuple[int, int | None], ...]
    since_notice: float
    all_stopping: float | None = None


@dataclass(frozen=True, slots=True)
class ReplacedWorker:
    """Who took a slot in a new generation: a warm spare or a new process."""

    rank: int
    local_rank: int
    failed_pid: int | None
    """The process that held the slot before (None: a slot new to the world)."""
    pid: int
    by_spare: bool


@dataclass(frozen=True, slots=True)
class GenerationAssigned:
    """In-place recovery: a new generation of the world was assigned (``pids`` in rank order)."""

    generation: int
    world_size: int
    reason: str
    pids: tuple[int, ...]
    replaced: tuple[ReplacedWorker, ...]


@dataclass(frozen=True, slots=True)
class GenerationFormed:
    """Every member entered the generation; ``since_failure`` is seconds from the failure."""

    generation: int
    world_size: int
    reason: str
    pids: tuple[int, ...]
    replaced: tuple[ReplacedWorker, ...]
    since_failure: float | None


@dataclass(frozen=True, slots=True)
class RecoveryFellBack:
    """In-place recovery gave up (``reason`` says why): the group restarts as without it."""

    reason: str


@dataclass(frozen=True, slots=True)
class WorkerEvicted:
    """In-place recovery killed a worker that hung while most of its world's collectives failed
    (it is replaced like any failed worker)."""

    rank: int
    local_rank: int
    pid: int
    reason: str


@dataclass(frozen=True, slots=True)
class CollectivesAborted:
    """A survivor of a world that lost a member was asked to abort its collectives (so that
    one blocked with the gone peer gets out); ``outcome`` is what it did (``aborted``, or
    ``unavailable``: it will be restarted if it does not leave in time)."""

    rank: int
    local_rank: int
    pid: int
    generation: int
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True)
class WorkerRestartedToLeave(WarningEvent):
    """A survivor did not leave its ended world in time (``why``: it could not abort its
    collectives, or it did not leave): it is killed and its slot goes to a spare or a new
    process, as a failed worker's would."""

    rank: int
    local_rank: int
    pid: int
    generation: int
    why: EvictCause
    reason: str


@dataclass(frozen=True, slots=True)
class SpareStarted:
    """A warm spare was started; it waits in ``worker.worlds()`` for a place."""

    pid: int


@dataclass(frozen=True, slots=True)
class StepsMarked:
    """A batch of one worker's step marks (``world.step(n)``; Unix times, this host's clock).

    ``times[i]`` is when step ``steps[i]`` began; ``done`` holds ``(step, time)`` where the rank
    finished its own work of a step (``world.work_done()``), ``saves`` the ``(start, end)`` of
    each checkpoint save it marked (``world.saving_checkpoint()``). ``aioelastic report`` reads
    these.
    """

    rank: int
    pid: int
    restart_count: int
    generation: int
    steps: tuple[int, ...]
    times: tuple[float, ...]
    done: tuple[tuple[int, float], ...] = ()
    saves: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class StepTimes:
    """A straggler window closed: each scored rank's median step time and score (the fastest
    rank's median over its own), and the ranks slower than ``factor`` times the fastest."""

    start: float
    end: float
    ranks: tuple[RankStepTime, ...]
    stragglers: tuple[int, ...]
    factor: float


@dataclass(frozen=True, slots=True)
class StragglerDetected(WarningEvent):
    """A rank became a straggler: its median step time in the window ending at ``window_end``
    is ``median`` seconds, ``1 / score`` times the fastest rank's ``fastest``."""

    rank: int
    score: float
    median: float
    fastest: float
    window_end: float


@dataclass(frozen=True, slots=True)
class TemplateReady:
    """The fork template (``--preload``) imported its modules: workers start as its forks."""

    pid: int
    modules: tuple[str, ...]
    seconds: float
    """How long it took from starting the template to its answer."""


@dataclass(frozen=True, slots=True)
class TemplateLearned:
    """The fork template imported what the workers had loaded (``--fork-template auto``): of
    the names it was given, it holds ``modules`` and left out ``left_out`` (their import would
    start a thread); the next workers fork from it."""

    pid: int
    modules: tuple[str, ...]
    left_out: tuple[str, ...]
    seconds: float


@dataclass(frozen=True, slots=True)
class TemplateLost(WarningEvent):
    """The fork template died or can fork no more (``reason``). ``restarting``: a new one is
    starting and workers start plainly until it is ready; otherwise every worker of the rest
    of the run starts plainly (importing the modules itself)."""

    pid: int | None
    reason: str
    restarting: bool


@dataclass(frozen=True, slots=True)
class RunFinished:
    """The run ended; ``result`` is what :meth:`ElasticAgent.run` returns."""

    result: RunResult


AgentEvent = (
    RendezvousJoining
    | RendezvousCompleted
    | WorkersStarted
    | WorkerSucceeded
    | WorkerFailed
    | WorkerReaped
    | StacksCaptured
    | TimeoutsLearnedIn
    | MembershipChanged
    | NodeFenced
    | WorkersStopped
    | GroupRestarting
    | ShutdownRequested
    | GenerationAssigned
    | GenerationFormed
    | RecoveryFellBack
    | WorkerEvicted
    | CollectivesAborted
    | WorkerRestartedToLeave
    | SpareStarted
    | StepsMarked
    | StepTimes
    | StragglerDetected
    | TemplateReady
    | TemplateLearned
    | TemplateLost
    | RunFinished
    | LogDirectoryCreated
    | PreemptionNoticed
    | StopStepAgreed
    | RankSaved
    | PreemptionEnded
)


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of :meth:`ElasticAgent.run`.

    ``returncodes`` maps each local rank of the last attempt to its exit status (minus the
    signal number when a signal ended it): under in-place recovery, its final holder's (a
    replacement's, never an idle spare's). ``failures`` are the failures of the last attempt,
    first one first; ``signal`` is the shutdown signal that stopped the run, if one did.
    """

    state: RunState
    returncodes: Mapping[int, int] = field(default_factory=dict)
    failures: tuple[WorkerFailure, ...] = ()
    restart_count: int = 0
    signal: int | None = None
    reason: str = ""

    @property
    def first_failure(self) -> WorkerFailure | None:
        """The root cause: the first worker that failed in the last attempt."""
        return self.failures[0] if self.failures else None

    @property
    def exit_status(self) -> int:
        """The launcher's exit status: 0, 1 for a failure, 128 + signal when stopped or
        preempted (on every node of a preempted job, with the signal of the node that got it)."""
        if self.state is RunState.SUCCEEDED:
            return 0
        if self.state in (RunState.STOPPED, RunState.PREEMPTED) and self.signal is not None:
            return 128 + self.signal
        return 1


@dataclass(frozen=True, slots=True)
class AgentStatistics:
    """A snapshot of an agent's counters."""

    state: str
    rendezvous_rounds: int
    restart_count: int
    membership_changes: int
    workers_started: int
    worker_failures: int
    reaps: int
