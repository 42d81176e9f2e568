"""The ``memory`` backend: many handlers in one event loop over one MemoryStore.

For tests and simulation. The store comes from ``params.config["store"]``, or is shared by
every handler created with the same ``endpoint`` (kept while any of them is alive).
``params.config["clock"]`` may supply a clock (a ManualClock in tests) for the handlers.
"""

from __future__ import annotations

import weakref

from aioelastic._clock import Clock
from aioelastic.rendezvous._elastic import ElasticRendezvousHandler
from aioelastic.rendezvous._errors import RendezvousParameterError
from aioelastic.rendezvous._parameters import ElasticSettings, RendezvousParameters
from aioelastic.store import MemoryStore

_shared: weakref.WeakValueDictionary[str, MemoryStore] = weakref.WeakValueDictionary()


class MemoryRendezvousHandler(ElasticRendezvousHandler):
    """An elastic handler over a :class:`MemoryStore`; it keeps the store alive."""

    def __init__(
        self,
        store: MemoryStore,
        settings: ElasticSettings,
        *,
        local_addr: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            store, settings, backend="memory", local_addr=local_addr or "127.0.0.1", clock=clock
        )
        self.memory_store = store


def create_handler(params: RendezvousParameters) -> MemoryRendezvousHandler:
    """Create a ``memory`` handler (see the module docstring for the config keys)."""
    settings = ElasticSettings.from_parameters(params, extra_keys={"store", "clock"})
    clock = params.get("clock")
    if clock is not None and not isinstance(clock, Clock):
        raise RendezvousParameterError(f"rendezvous option clock={clock!r} is not a Clock")
    store = params.get("store")
    if store is None:
        store = _shared.get(params.endpoint)
        if store is None:
            store = MemoryStore(clock=clock)
            _shared[params.endpoint] = store
    elif not isinstance(store, MemoryStore):
        raise RendezvousParameterError(
            f"rendezvous option store={store!r} is not a MemoryStore; the memory backend "
            "runs in-process only (use c10d or etcd across processes)"
        )
    local_addr = params.local_addr or params.get("local_addr")
    return MemoryRendezvousHandler(store, settings, local_addr=local_addr, clock=clock)
