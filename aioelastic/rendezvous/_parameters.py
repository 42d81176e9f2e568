"""Rendezvous parameters (torch's names and validation) and the settings parsed from them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aioelastic.rendezvous._errors import RendezvousParameterError

_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"0", "false", "f", "no", "n"})


class RendezvousParameters:
    """What a backend needs to create a handler: backend name, endpoint, run id, node bounds.

    ``config`` holds the backend's options as given (``--rdzv-conf`` delivers strings); read
    them with :meth:`get`, :meth:`get_as_bool`, :meth:`get_as_int` or :meth:`get_as_float`.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **config: Any,
    ) -> None:
        if not backend or not isinstance(backend, str):
            raise RendezvousParameterError(
                f"the rendezvous backend must be a non-empty string, not {backend!r}"
            )
        if not isinstance(run_id, str) or not run_id:
            raise RendezvousParameterError(f"the run id must be a non-empty string, not {run_id!r}")
        if not isinstance(min_nodes, int) or min_nodes < 1:
            raise RendezvousParameterError(
                f"min_nodes must be an integer of at least 1, not {min_nodes!r}"
            )
        if not isinstance(max_nodes, int) or max_nodes < min_nodes:
            raise RendezvousParameterError(
                f"max_nodes ({max_nodes!r}) must be an integer of at least min_nodes ({min_nodes})"
            )
        self.backend = backend
        self.endpoint = endpoint or ""
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config: dict[str, Any] = dict(config)

    def __repr__(self) -> str:
        return (
            f"RendezvousParameters(backend={self.backend!r}, endpoint={self.endpoint!r}, "
            f"run_id={self.run_id!r}, min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
            f"local_addr={self.local_addr!r}, config={self.config!r})"
        )

    def get(self, key: str, default: Any = None) -> Any:
        """Return the value of ``key``, or ``default`` when it is not set."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Return ``key`` as a bool: bools, 0/1 and 1/0, true/false, t/f, yes/no, y/n."""
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            if value.strip().lower() in _TRUE:
                return True
            if value.strip().lower() in _FALSE:
                return False
        raise RendezvousParameterError(
            f"rendezvous option {key}={value!r} is not a boolean; use true/false, yes/no or 1/0"
        )

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """Return ``key`` as an int (strings are parsed)."""
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool):
            raise RendezvousParameterError(f"rendezvous option {key}={value!r} is not an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise RendezvousParameterError(
                f"rendezvous option {key}={value!r} is not an integer"
            ) from None

    def get_as_float(self, key: str, default: float | None = None) -> float | None:
        """Return ``key`` as a finite float (strings are parsed)."""
        value = self.get(key, default)
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RendezvousParameterError(
                f"rendezvous option {key}={value!r} is not a number of seconds"
            ) from None
        if isinstance(value, bool) or not math.isfinite(number):
            raise RendezvousParameterError(
                f"rendezvous option {key}={value!r} is not a finite number of seconds"
            )
        return number

    def check_keys(self, known: Iterable[str]) -> None:
        """Raise naming the config keys that are not in ``known`` (and listing the known ones)."""
        known_keys = set(known)
        unknown = sorted(set(self.config) - known_keys)
        if unknown:
            raise RendezvousParameterError(
                f"unknown rendezvous option(s) {', '.join(unknown)} for backend "
                f"{self.backend!r}; known options: {', '.join(sorted(known_keys))}"
            )


ELASTIC_KEYS = frozenset(
    {
        "join_timeout",
        "timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "read_timeout",
        "local_addr",
    }
)
"""Config keys every elastic backend understands (torch's names; ``timeout`` = join)."""


MAX_ATTEMPT_TIMEOUT = 5.0


@dataclass(frozen=True)
class ElasticSettings:
    """The validated settings of an elastic rendezvous, in seconds."""

    run_id: str
    min_nodes: int
    max_nodes: int
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    heartbeat_timeout: float = 15.0
    read_timeout: float = 60.0
    """How long a store call may take (connecting included) before it counts as failed."""

    def __post_init__(self) -> None:
        positive = (
            "join_timeout",
            "close_timeout",
            "keep_alive_interval",
            "heartbeat_timeout",
            "read_timeout",
        )
        for name in positive:
            value = getattr(self, name)
            if not value > 0:
                raise RendezvousParameterError(
                    f"rendezvous option {name}={value:g} must be a positive number of seconds"
                )
        if not self.last_call_timeout >= 0:
            raise RendezvousParameterError(
                f"rendezvous option last_call_timeout={self.last_call_timeout:g} must be >= 0"
            )
        if self.heartbeat_timeout <= self.keep_alive_interval:
            raise RendezvousParameterError(
                f"heartbeat_timeout ({self.heartbeat_timeout:g} s) must exceed "
                f"keep_alive_interval ({self.keep_alive_interval:g} s), or live nodes expire "
                "between two keep-alives"
            )

    @property
    def attempt_timeout(self) -> float:
        """How long one store attempt of the rendezvous may take before it is given up (and
        another member, or a new connection, is tried): half the slack between a keep-alive
        and the liveness key's expiry, at most 5 s, so a keep-alive stuck on a dead member or
        connection is retried before the node is taken for dead."""
        return min(MAX_ATTEMPT_TIMEOUT, (self.heartbeat_timeout - self.keep_alive_interval) / 2)

    @classmethod
    def from_parameters(
        cls, params: RendezvousParameters, extra_keys: Iterable[str] = ()
    ) -> ElasticSettings:
        """Parse and validate ``params``; unknown config keys raise, naming them."""
        params.check_keys(ELASTIC_KEYS | set(extra_keys))
        join = params.get_as_float("join_timeout")
        alias = params.get_as_float("timeout")
        if join is not None and alias is not None and join != alias:
            raise RendezvousParameterError(
                f"join_timeout={join:g} and its alias timeout={alias:g} disagree; set one of them"
            )
        interval = seconds(params, "keep_alive_interval", cls.keep_alive_interval)
        attempts = params.get_as_int("keep_alive_max_attempt", 3)
        if attempts is None or attempts < 1:
            raise RendezvousParameterError(
                f"rendezvous option keep_alive_max_attempt={attempts!r} must be at least 1"
            )
        return cls(
            run_id=params.run_id,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            join_timeout=next((v for v in (join, alias) if v is not None), cls.join_timeout),
            last_call_timeout=seconds(params, "last_call_timeout", cls.last_call_timeout),
            close_timeout=seconds(params, "close_timeout", cls.close_timeout),
            keep_alive_interval=interval,
            heartbeat_timeout=seconds(params, "heartbeat_timeout", interval * attempts),
            read_timeout=seconds(params, "read_timeout", cls.read_timeout),
        )


def seconds(params: RendezvousParameters, key: str, default: float) -> float:
    """Return ``key`` as seconds, ``default`` when unset."""
    value = params.get_as_float(key, default)
    assert value is not None  # a default was given
    return value
