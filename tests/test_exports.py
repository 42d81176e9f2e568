"""Every public module exports exactly the names we meant, each implemented in a private module.

A module is public when no part of its dotted name starts with ``_``. Adding one, or a name to
one, means adding it here: the public surface changes on purpose only.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import aioelastic

PUBLIC = {
    "aioelastic": {
        "__version__",
    },
    "aioelastic.agent": {
        "AgentError", "AgentEvent", "AgentStateError", "AgentStatistics", "ElasticAgent",
        "ForensicsSpec", "GroupRestarting", "HangReport", "LogDirectoryCreated", "LogSpec",
        "MembershipChanged", "NodeFenced", "NodeSlot", "PreemptionEnded", "PreemptionNoticed",
        "RankSaved", "RendezvousCompleted", "RendezvousJoining",
        "RoundInfo", "RunFinished", "RunResult", "RunState", "ShutdownRequested", "StackRecord",
        "StacksCaptured", "Std", "StopStepAgreed", "TimeoutsLearnedIn", "WorkerFailed",
        "WorkerFailure",
        "WorkerRanks", "WorkerReaped", "WorkerSpawnError", "WorkerSpec", "WorkerSpecError",
        "WorkerSucceeded", "WorkersStarted", "WorkersStopped", "assign_ranks", "format_report",
        "worker_env",
    },
    "aioelastic.cli": {
        "SUBCOMMAND_MODULES", "build_parser", "main",
    },
    "aioelastic.errors": {
        "ERROR_FILE_ENV", "error_file_payload", "record", "write_error_file",
    },
    "aioelastic.events": {
        "Emitter", "EventLogError", "EventRecord", "EventStream", "EventStreamStatistics",
        "GoodputReport", "JsonLinesWriter", "LoggedEvent", "LoggingSubscriber",
        "RendezvousWaiting", "Subscriber", "WARNING_KINDS", "WarningEvent", "decode_line",
        "encode_record", "goodput_report", "observe", "read_event_log", "to_data",
        "watch_rendezvous",
    },
    "aioelastic.metrics": {
        "DURATION_BUCKETS", "MetricsPortError", "MetricsUnavailableError", "PrometheusMetrics",
        "metrics_listener", "serve_metrics",
    },
    "aioelastic.rendezvous": {
        "ElasticRendezvousHandler", "ElasticSettings", "EventCallback", "HandlerCreator",
        "InvalidationReason", "NodeLost", "RendezvousClosedError", "RendezvousConnectionError",
        "RendezvousError", "RendezvousEvent", "RendezvousGracefulExitError", "RendezvousHandler",
        "RendezvousHandlerRegistry", "RendezvousInfo", "RendezvousParameterError",
        "RendezvousParameters", "RendezvousStateError", "RendezvousStatistics",
        "RendezvousStoreInfo", "RendezvousTimeoutError", "RendezvousUsageError", "RoundCompleted",
        "RoundInvalidated", "RoundJoining", "StaticRendezvousStatistics", "StoreOpener",
        "get_rendezvous_handler", "handler_registry",
    },
    "aioelastic.store": {
        "BlockingTCPStore", "DEFAULT_TIMEOUT", "EtcdFailover", "EtcdLeaseLost", "EtcdStore",
        "EtcdStoreEvent",
        "EtcdStoreStatistics", "EtcdWatchResumed", "MemoryStore", "MemoryStoreStatistics",
        "PrefixStore", "RelayStatistics", "Snapshot", "Store", "StoreClosedError",
        "StoreConnectionError",
        "StoreCredentials", "StoreError", "StoreOutcomeUnknownError", "StoreProtocolError",
        "StoreRefusedError", "StoreServerGone", "StoreTimeoutError", "StoreValueError", "TCPStore",
        "TCPStoreServer",
        "TCPStoreServerStatistics", "TorchServiceStatistics", "TorchStoreListener", "Value",
    },
    "aioelastic.testing": {
        "DEFAULT_CONFIG", "EtcdCluster", "EtcdMember", "EventRecorder", "FaultUnsupportedError",
        "FaultyStore", "FaultyStoreStatistics", "HOW_TO_GET_ETCD", "Host", "ManualClock",
        "Network", "NetworkUnavailableError", "Node", "ProtocolViolation", "RendezvousCluster",
        "SimulatedWorker", "Stall", "WorldSimulation", "find_etcd_binary", "unavailable_reason",
    },
    "aioelastic.timer": {
        "DeadlineHeap", "Expiry", "FileTimerClient", "FileTimerServer", "InvalidDurationError",
        "LearnedScope", "LearnedTimeouts", "LearningPolicy", "LineDecoder", "LocalTimerClient",
        "LocalTimerServer", "NoTimerClientError", "PIPE_BUF", "ProcessExited", "RejectReason",
        "Rejection", "RequestRejected", "RequestTooLargeError", "ScopeExpiredError", "Timer",
        "TimerAcquired", "TimerClient", "TimerConfigError", "TimerError", "TimerEvent",
        "TimerExpired", "TimerReaped", "TimerReleased", "TimerRequest", "TimerServerStatistics",
        "TimerServerUnavailableError", "WatchPolicy", "configure", "decode_line", "encode_request",
        "expires", "learned_limits", "read_learned",
    },
    "aioelastic.worker": {
        "AgentLinkError", "HandOverError", "HandedOver", "LinkProtocolError", "World",
        "WorldChanged", "async_worlds", "hand_over", "worlds",
    },
}  # fmt: skip
"""Each public module's ``__all__``."""

TYPING_IDIOMS = {"TYPE_CHECKING", "annotations"}
"""Names a package may hold besides ``__all__``: the typing imports every module makes."""


def public_modules() -> set[str]:
    found = {aioelastic.__name__}
    for info in pkgutil.walk_packages(aioelastic.__path__, "aioelastic."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.add(info.name)
    return found


def is_package(name: str) -> bool:
    return hasattr(importlib.import_module(name), "__path__")


def test_every_public_module_is_pinned() -> None:
    """The pinned list names exactly the package's public modules."""
    assert sorted(PUBLIC) == sorted(public_modules())


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_module_exports_exactly_its_pinned_names(name: str) -> None:
    """__all__ lists the pinned names once each, and every one of them resolves."""
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(PUBLIC[name])
    assert len(module.__all__) == len(set(module.__all__))
    assert [n for n in module.__all__ if getattr(module, n, None) is None] == []


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_classes_and_functions_live_in_private_modules(name: str) -> None:
    """A package re-exports what its private modules implement; a module exports its own."""
    module = importlib.import_module(name)
    elsewhere = {}
    for exported in module.__all__:
        obj = getattr(module, exported)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            home = obj.__module__
            if home != name and not any(p.startswith("_") for p in home.split(".")):
                elsewhere[exported] = home
    assert elsewhere == {}


@pytest.mark.parametrize(
    "name", sorted(n for n in PUBLIC if hasattr(importlib.import_module(n), "__path__"))
)
def test_a_package_holds_no_public_name_besides_its_exports(name: str) -> None:
    """Nothing private leaks from a package: its other public attributes are its submodules."""
    package = importlib.import_module(name)
    leaked = {
        attr
        for attr, value in vars(package).items()
        if not attr.startswith("_")
        and attr not in package.__all__
        and attr not in TYPING_IDIOMS
        and not isinstance(value, types.ModuleType)
    }
    assert leaked == set()
