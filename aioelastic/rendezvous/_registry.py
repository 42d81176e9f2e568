"""The backend registry: backend names to handler creators, with the built-in backends."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from aioelastic.rendezvous._errors import RendezvousParameterError
from aioelastic.rendezvous._handler import RendezvousHandler
from aioelastic.rendezvous._parameters import RendezvousParameters

HandlerCreator = Callable[[RendezvousParameters], RendezvousHandler]
"""Creates a handler from parameters without I/O (the handler connects in ``__aenter__``)."""


class RendezvousHandlerRegistry:
    """Maps backend names to the creators of their handlers."""

    def __init__(self) -> None:
        self._creators: dict[str, HandlerCreator] = {}

    def register(self, backend: str, creator: HandlerCreator) -> None:
        """Register ``creator`` for ``backend``; registering a backend twice is an error."""
        if not backend:
            raise RendezvousParameterError("a rendezvous backend needs a non-empty name")
        current = self._creators.get(backend)
        if current is not None and current is not creator:
            raise RendezvousParameterError(
                f"rendezvous backend {backend!r} is already registered to {_name(current)}; "
                f"cannot register {_name(creator)} too"
            )
        self._creators[backend] = creator

    def backends(self) -> list[str]:
        """The registered backend names, sorted."""
        return sorted(self._creators)

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        """Create the handler of ``params.backend``."""
        creator = self._creators.get(params.backend) or _plugged_in(params.backend)
        if creator is None:
            raise RendezvousParameterError(
                f"unknown rendezvous backend {params.backend!r}; registered backends: "
                f"{', '.join(self.backends()) or 'none'}"
            )
        handler = creator(params)
        if not isinstance(handler, RendezvousHandler):
            raise RendezvousParameterError(
                f"the creator {_name(creator)} of backend {params.backend!r} returned "
                f"{type(handler).__qualname__}, not an aioelastic.rendezvous.RendezvousHandler "
                "(a torch handler is synchronous and cannot drive the async agent)"
            )
        if handler.get_backend() != params.backend:
            raise RendezvousParameterError(
                f"the creator {_name(creator)} of backend {params.backend!r} returned a handler "
                f"of backend {handler.get_backend()!r}"
            )
        return handler


def lazy_creator(module: str, attribute: str = "create_handler") -> HandlerCreator:
    """A creator that imports ``module`` on first use (so optional dependencies stay optional)."""

    def create(params: RendezvousParameters) -> RendezvousHandler:
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            raise RendezvousParameterError(
                f"rendezvous backend {params.backend!r} is not available: importing {module} "
                f"failed ({error}); install its optional dependencies"
            ) from error
        creator: HandlerCreator = getattr(loaded, attribute)
        return creator(params)

    create.__qualname__ = f"lazy_creator({module!r}, {attribute!r})"
    return create


def _plugged_in(backend: str) -> HandlerCreator | None:
    """The creator of ``backend`` from the ``torchrun.handlers`` entry points, as torch finds
    them: the entry point loads a function that returns the creator."""
    from aioelastic._entry_points import find_entry_point

    entry = find_entry_point("torchrun.handlers", backend)
    if entry is None:
        return None
    try:
        creator: HandlerCreator = entry.load()()
    except Exception as error:  # a broken plug-in is the user's to fix: say which
        raise RendezvousParameterError(
            f"rendezvous backend {backend!r} from entry point {entry.value} failed to load: "
            f"{type(error).__name__}: {error}"
        ) from error
    return creator


def _name(creator: HandlerCreator) -> str:
    module = getattr(creator, "__module__", "?")
    return f"{module}.{getattr(creator, '__qualname__', repr(creator))}"


handler_registry = RendezvousHandlerRegistry()
"""The registry :func:`get_rendezvous_handler` uses; the built-in backends register here."""

for _backend, _module in (
    ("static", "aioelastic.rendezvous._static"),
    ("c10d", "aioelastic.rendezvous._c10d"),
    ("memory", "aioelastic.rendezvous._memory"),
    ("etcd", "aioelastic.rendezvous._etcd"),
    ("etcd-v3", "aioelastic.rendezvous._etcd"),
    ("etcd-v2", "aioelastic.rendezvous._etcd"),
):
    handler_registry.register(_backend, lazy_creator(_module))


def get_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Create the handler of ``params.backend`` from the built-in registry."""
    return handler_registry.create_handler(params)
