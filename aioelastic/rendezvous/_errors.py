"""The rendezvous exceptions: misuse (bad parameters, unknown backends, a handler used out of
order) apart from peer and infrastructure failure (timeouts, lost store, closed job) and from
store state this version does not understand."""

from __future__ import annotations


class RendezvousError(Exception):
    """Base class of every rendezvous failure."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous was closed (the job is finished); no further round will form."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"the rendezvous of run {run_id!r} is closed; the job has finished or was stopped, "
            "start a new run id to form a new job"
        )


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """Not enough nodes joined within ``join_timeout``."""

    def __init__(self, run_id: str, timeout: float, joined: int, min_nodes: int) -> None:
        self.run_id = run_id
        self.timeout = timeout
        self.joined = joined
        self.min_nodes = min_nodes
        super().__init__(
            f"rendezvous of run {run_id!r} timed out after {timeout:g} s with {joined} live "
            f"node(s) joined, {min_nodes} needed; start more nodes or raise join_timeout"
        )


class RendezvousConnectionError(RendezvousError, ConnectionError):
    """The rendezvous store could not be reached."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state in the store is not what this version understands."""


class RendezvousUsageError(RendezvousStateError, RuntimeError):
    """A handler was used in a way it does not support (not entered, entered twice, called
    after shutdown, two joins at once); a subclass of :class:`RendezvousStateError`, which
    earlier versions raised for misuse."""


class RendezvousGracefulExitError(RendezvousError):
    """This node should exit without error (for example: it was not needed in the round)."""


class RendezvousParameterError(RendezvousError, ValueError):
    """A rendezvous parameter or configuration key is missing, unknown or malformed."""
