"""The elastic agent: run one node's workers of an elastic job, torchrun-compatible.

``ElasticAgent(spec).run()`` joins the rendezvous, starts ``spec.local_world_size`` workers
with torch's environment, restarts the group when a worker fails or the watchdog reaps it,
re-rendezvouses when membership changes and stops everything cleanly on a signal. The
``aioelastic run`` command drives it from torchrun's flags.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from aioelastic._kinds.agent import (
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
    from aioelastic._kinds.failures import HangReport, StackRecord, WorkerFailure
    from aioelastic.agent._agent import ElasticAgent
    from aioelastic.agent._env import (
        NodeSlot,
        RoundInfo,
        WorkerRanks,
        assign_ranks,
        worker_env,
    )
    from aioelastic.agent._errors import (
        AgentError,
        AgentStateError,
        WorkerSpawnError,
        WorkerSpecError,
    )
    from aioelastic.agent._report import format_report
    from aioelastic.agent._spec import (
        ForensicsSpec,
        LogSpec,
        Std,
        WorkerSpec,
    )

_LAZY = {
    "AgentEvent": "aioelastic._kinds.agent",
    "AgentStatistics": "aioelastic._kinds.agent",
    "GroupRestarting": "aioelastic._kinds.agent",
    "LogDirectoryCreated": "aioelastic._kinds.agent",
    "MembershipChanged": "aioelastic._kinds.agent",
    "NodeFenced": "aioelastic._kinds.agent",
    "PreemptionEnded": "aioelastic._kinds.agent",
    "PreemptionNoticed": "aioelastic._kinds.agent",
    "RankSaved": "aioelastic._kinds.agent",
    "RendezvousCompleted": "aioelastic._kinds.agent",
    "RendezvousJoining": "aioelastic._kinds.agent",
    "RunFinished": "aioelastic._kinds.agent",
    "RunResult": "aioelastic._kinds.agent",
    "RunState": "aioelastic._kinds.agent",
    "ShutdownRequested": "aioelastic._kinds.agent",
    "StacksCaptured": "aioelastic._kinds.agent",
    "StopStepAgreed": "aioelastic._kinds.agent",
    "TimeoutsLearnedIn": "aioelastic._kinds.agent",
    "WorkerFailed": "aioelastic._kinds.agent",
    "WorkerReaped": "aioelastic._kinds.agent",
    "WorkerSucceeded": "aioelastic._kinds.agent",
    "WorkersStarted": "aioelastic._kinds.agent",
    "WorkersStopped": "aioelastic._kinds.agent",
    "HangReport": "aioelastic._kinds.failures",
    "StackRecord": "aioelastic._kinds.failures",
    "WorkerFailure": "aioelastic._kinds.failures",
    "ElasticAgent": "aioelastic.agent._agent",
    "NodeSlot": "aioelastic.agent._env",
    "RoundInfo": "aioelastic.agent._env",
    "WorkerRanks": "aioelastic.agent._env",
    "assign_ranks": "aioelastic.agent._env",
    "worker_env": "aioelastic.agent._env",
    "AgentError": "aioelastic.agent._errors",
    "AgentStateError": "aioelastic.agent._errors",
    "WorkerSpawnError": "aioelastic.agent._errors",
    "WorkerSpecError": "aioelastic.agent._errors",
    "format_report": "aioelastic.agent._report",
    "ForensicsSpec": "aioelastic.agent._spec",
    "LogSpec": "aioelastic.agent._spec",
    "Std": "aioelastic.agent._spec",
    "WorkerSpec": "aioelastic.agent._spec",
}
"""Where each exported name lives: imported on first use, so that ``import aioelastic.agent``
(or a module under it) does not load the agent's machinery."""


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
