"""Rendezvous: nodes of an elastic job agree on membership, ranks and the job's store.

``get_rendezvous_handler(params)`` returns a handler for the backend ``params.backend``
(``static``, ``c10d``, ``etcd``/``etcd-v3``, ``memory``); use it as ``async with``.
"""

from aioelastic.rendezvous._errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousParameterError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from aioelastic.rendezvous._handler import RendezvousHandler
from aioelastic.rendezvous._info import (
    InvalidationReason,
    RendezvousInfo,
    RendezvousStoreInfo,
    RoundInvalidated,
)
from aioelastic.rendezvous._parameters import RendezvousParameters
from aioelastic.rendezvous._registry import (
    HandlerCreator,
    RendezvousHandlerRegistry,
    get_rendezvous_handler,
    handler_registry,
)

__all__ = [
    "HandlerCreator",
    "InvalidationReason",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameterError",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "RoundInvalidated",
    "get_rendezvous_handler",
    "handler_registry",
]
