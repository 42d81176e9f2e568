"""Rendezvous: nodes of an elastic job agree on membership, ranks and the job's store.

``get_rendezvous_handler(params)`` returns a handler for the backend ``params.backend``
(``static``, ``c10d``, ``etcd``/``etcd-v3``, ``memory``); use it as ``async with``.
:class:`ElasticRendezvousHandler` runs elastic rendezvous over any
:class:`~aioelastic.store.Store` (the ``c10d``, ``etcd`` and ``memory`` backends build one).
"""

from aioelastic.rendezvous._elastic import ElasticRendezvousHandler, EventCallback, StoreOpener
from aioelastic.rendezvous._errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousParameterError,
    RendezvousStateError,
    RendezvousTimeoutError,
    RendezvousUsageError,
)
from aioelastic.rendezvous._handler import RendezvousHandler
from aioelastic.rendezvous._info import (
    InvalidationReason,
    NodeLost,
    RendezvousEvent,
    RendezvousInfo,
    RendezvousStatistics,
    RendezvousStoreInfo,
    RoundCompleted,
    RoundInvalidated,
    RoundJoining,
    StaticRendezvousStatistics,
)
from aioelastic.rendezvous._parameters import ElasticSettings, RendezvousParameters
from aioelastic.rendezvous._registry import (
    HandlerCreator,
    RendezvousHandlerRegistry,
    get_rendezvous_handler,
    handler_registry,
)

__all__ = [
    "ElasticRendezvousHandler",
    "ElasticSettings",
    "EventCallback",
    "HandlerCreator",
    "InvalidationReason",
    "NodeLost",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousEvent",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameterError",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStatistics",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "RendezvousUsageError",
    "RoundCompleted",
    "RoundInvalidated",
    "RoundJoining",
    "StaticRendezvousStatistics",
    "StoreOpener",
    "get_rendezvous_handler",
    "handler_registry",
]
