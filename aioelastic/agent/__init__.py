"""The elastic agent: run one node's workers of an elastic job, torchrun-compatible.

``ElasticAgent(spec).run()`` joins the rendezvous, starts ``spec.local_world_size`` workers
with torch's environment, restarts the group when a worker fails or the watchdog reaps it,
re-rendezvouses when membership changes and stops everything cleanly on a signal. The
``aioelastic run`` command drives it from torchrun's flags.
"""

from aioelastic.agent._agent import ElasticAgent
from aioelastic.agent._env import NodeSlot, RoundInfo, WorkerRanks, assign_ranks, worker_env
from aioelastic.agent._errors import (
    AgentError,
    AgentStateError,
    WorkerSpawnError,
    WorkerSpecError,
)
from aioelastic.agent._events import (
    AgentEvent,
    AgentStatistics,
    GroupRestarting,
    LogDirectoryCreated,
    MembershipChanged,
    NodeFenced,
    PreemptionEnded,
    PreemptionNoticed,
    RankSaved,
    RendezvousCompleted,
    RendezvousJoining,
    RunFinished,
    RunResult,
    RunState,
    ShutdownRequested,
    StacksCaptured,
    StopStepAgreed,
    TimeoutsLearnedIn,
    WorkerFailed,
    WorkerReaped,
    WorkersStarted,
    WorkersStopped,
    WorkerSucceeded,
)
from aioelastic.agent._report import HangReport, StackRecord, WorkerFailure, format_report
from aioelastic.agent._spec import ForensicsSpec, LogSpec, Std, WorkerSpec

__all__ = [
    "AgentError",
    "AgentEvent",
    "AgentStateError",
    "AgentStatistics",
    "ElasticAgent",
    "ForensicsSpec",
    "GroupRestarting",
    "HangReport",
    "LogDirectoryCreated",
    "LogSpec",
    "MembershipChanged",
    "NodeFenced",
    "NodeSlot",
    "PreemptionEnded",
    "PreemptionNoticed",
    "RankSaved",
    "RendezvousCompleted",
    "RendezvousJoining",
    "RoundInfo",
    "RunFinished",
    "RunResult",
    "RunState",
    "ShutdownRequested",
    "StackRecord",
    "StacksCaptured",
    "Std",
    "StopStepAgreed",
    "TimeoutsLearnedIn",
    "WorkerFailed",
    "WorkerFailure",
    "WorkerRanks",
    "WorkerReaped",
    "WorkerSpawnError",
    "WorkerSpec",
    "WorkerSpecError",
    "WorkerSucceeded",
    "WorkersStarted",
    "WorkersStopped",
    "assign_ranks",
    "format_report",
    "worker_env",
]
