"""Timeouts that cannot work together, refused when the agent starts.

Each part has its own timeout, and some depend on another part's: a node is declared lost when
its liveness key is not renewed within ``heartbeat_timeout``, renewed every
``keep_alive_interval``; whatever waits for a lost node to be noticed (joining a round, an
in-place recovery) must wait at least that long. The rules are data (:data:`RULES`), checked
by :func:`timeout_conflicts` on plain values (pure; the agent gathers them), each message
naming both values and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aioelastic.agent._errors import AgentError

if TYPE_CHECKING:
    from aioelastic.agent._spec import WorkerSpec


@dataclass(frozen=True, slots=True)
class Rule:
    """``larger >= factor * smaller`` must hold; ``why`` says what breaks otherwise."""

    larger: str
    smaller: str
    factor: float
    why: str

    @property
    def text(self) -> str:
        """The rule as the docs list it: ``heartbeat_timeout >= 2 x keep_alive_interval``."""
        times = "" if self.factor == 1 else f"{self.factor:g} x "
        return f"{self.larger} >= {times}{self.smaller}"

    def holds(self, values: Mapping[str, float]) -> bool:
        """True when either value is unset, or the relation holds."""
        if self.larger not in values or self.smaller not in values:
            return True
        return values[self.larger] >= values[self.smaller] * self.factor


RULES: tuple[Rule, ...] = (
    Rule(
        "heartbeat_timeout",
        "keep_alive_interval",
        2.0,
        "a node would be declared lost after a single late keep-alive (a pause, a slow store "
        "write); allow at least two keep-alives per heartbeat timeout",
    ),
    Rule(
        "join_timeout",
        "last_call_timeout",
        1.0,
        "the join would time out while the round still waits its last call for more nodes",
    ),
    Rule(
        "join_timeout",
        "heartbeat_timeout",
        1.0,
        "a node that dies while the others wait to join is noticed only after the heartbeat "
        "timeout, by which time the join has failed",
    ),
    Rule(
        "recovery_timeout",
        "heartbeat_timeout",
        1.0,
        "a lost node is noticed only after the heartbeat timeout, so an in-place recovery "
        "would always give up before it could know who is gone",
    ),
)
"""Every rule the agent checks at start (docs/guides/agent.md lists them)."""

LABELS: Mapping[str, str] = {
    "heartbeat_timeout": "--rdzv-conf heartbeat_timeout",
    "keep_alive_interval": "--rdzv-conf keep_alive_interval",
    "join_timeout": "--rdzv-conf join_timeout",
    "last_call_timeout": "--rdzv-conf last_call_timeout",
    "recovery_timeout": "--recovery-timeout",
}
"""How each value is set on ``aioelastic run``'s command line."""


class TimeoutConflictError(AgentError, ValueError):
    """Two timeouts cannot work together; the message names both and the rule."""

    def __init__(self, rule: Rule, values: Mapping[str, float]) -> None:
        self.rule = rule
        big, small = values[rule.larger], values[rule.smaller]
        times = "" if rule.factor == 1 else f"{rule.factor:g} x "
        super().__init__(
            f"{rule.larger}={big:g} s ({LABELS.get(rule.larger, rule.larger)}) must be "
            f"at least {times}{rule.smaller}={small:g} s "
            f"({LABELS.get(rule.smaller, rule.smaller)}): {rule.why}"
        )


def timeout_conflicts(values: Mapping[str, float]) -> list[TimeoutConflictError]:
    """The rules ``values`` break, in :data:`RULES` order (empty: they work together)."""
    return [TimeoutConflictError(rule, values) for rule in RULES if not rule.holds(values)]


def check_timeouts(values: Mapping[str, float]) -> None:
    """Raise the first conflict in ``values``."""
    conflicts = timeout_conflicts(values)
    if conflicts:
        raise conflicts[0]


def agent_timeouts(spec: WorkerSpec) -> dict[str, float]:
    """The values the rules compare, from ``spec`` and its rendezvous handler's settings."""
    from aioelastic.rendezvous._parameters import ElasticSettings

    values: dict[str, float] = {}
    settings = getattr(spec.rdzv_handler, "settings", None)
    if isinstance(settings, ElasticSettings):
        values.update(
            heartbeat_timeout=settings.heartbeat_timeout,
            keep_alive_interval=settings.keep_alive_interval,
            join_timeout=settings.join_timeout,
            last_call_timeout=settings.last_call_timeout,
        )
    lost_nodes_possible = isinstance(settings, ElasticSettings) and settings.max_nodes > 1
    if spec.recovery == "in-place" and lost_nodes_possible:
        values["recovery_timeout"] = spec.recovery_timeout
    return values
