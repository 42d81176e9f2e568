"""The agent's exceptions: misuse (a bad spec or flag) apart from failures while running."""

from __future__ import annotations


class AgentError(Exception):
    """Base class of every agent failure."""


class WorkerSpecError(AgentError, ValueError):
    """A :class:`~aioelastic.agent.WorkerSpec` or a launcher option has a value that cannot work."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r} is invalid: {expected}")


class WorkerSpawnError(AgentError, OSError):
    """A worker process could not be started (missing program, permission, resources)."""

    def __init__(self, argv: list[str], cause: OSError) -> None:
        self.argv = argv
        super().__init__(
            cause.errno,
            f"could not start worker {argv[0]!r}: {cause.strerror or cause}; "
            "check the program path and that it is executable",
        )


class AgentStateError(AgentError, RuntimeError):
    """The agent was used in a way its life cycle does not allow (for example run twice)."""
