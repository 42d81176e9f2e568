"""This node's own view of its liveness key: when it may already be gone (pure; ``now`` is given).

The store expires a node's liveness key ``heartbeat_timeout`` after it applied the last
renewal, on the store's clock. The node cannot see that clock, but it knows when it *sent*
each renewal the store acknowledged, and the store applied it no earlier than that. So, by
the node's own monotonic clock, its key lives at least until ``renewed_at +
heartbeat_timeout``, and may be gone any time after. A node that has had no renewal
acknowledged by ``fence_at`` (that moment less a margin, to stop its workers in) must act as
if it were already gone: its workers are fenced, and it joins again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Lease:
    """The renewals of one liveness key, as acknowledged to this node."""

    heartbeat_timeout: float
    margin: float
    """How long before the key may expire the node fences: time to stop its workers."""
    renewed_at: float = -math.inf
    """When the last acknowledged renewal was sent (-inf: none yet)."""

    @classmethod
    def for_settings(cls, heartbeat_timeout: float, keep_alive_interval: float) -> Lease:
        """A lease fencing one keep-alive interval early (at most a quarter of the timeout)."""
        return cls(heartbeat_timeout, min(keep_alive_interval, heartbeat_timeout / 4))

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` was acknowledged (late replies never move it back)."""
        self.renewed_at = max(self.renewed_at, sent_at)

    @property
    def fence_at(self) -> float:
        """When the node must consider its key gone unless a newer renewal is acknowledged."""
        return self.renewed_at + self.heartbeat_timeout - self.margin

    def lapsed(self, now: float) -> bool:
        """Whether, at ``now``, the node must act as if its key were gone."""
        return now >= self.fence_at

    def describe(self, now: float) -> str:
        """Why the lease lapsed, in words."""
        return (
            f"no liveness renewal acknowledged for {now - self.renewed_at:.1f} s (heartbeat "
            f"timeout {self.heartbeat_timeout:g} s): this node may already be taken for dead"
        )


@dataclass(slots=True)
class RenewalFailures:
    """A run of failed keep-alives, so a partition is logged when it starts and summarised
    once when it ends or fences the node, not at every interval (pure; times are given).

    An attempt sent before the last acknowledged renewal that fails late (it hung on a dead
    connection while a newer one got through) neither starts nor extends a run.
    """

    since: float | None = None
    """When the run's first failure was seen (None: keep-alives are succeeding)."""
    failures: int = 0
    last_error: str = ""
    renewed_sent: float = -math.inf
    """When the last acknowledged renewal was sent."""

    def failed(self, sent: float, now: float, error: str) -> str | None:
        """Count the failure of an attempt sent at ``sent``; the line to log if it starts a run."""
        if sent < self.renewed_sent:
            return None
        self.failures += 1
        self.last_error = error
        if self.since is not None:
            return None
        self.since = now
        return f"keep-alive failed: {error}; failing again is summarised once it recovers or fences"

    def renewed(self, sent: float, now: float) -> str | None:
        """A renewal sent at ``sent`` was acknowledged: the summary of the run it ends, if any."""
        self.renewed_sent = max(self.renewed_sent, sent)
        if self.since is None:
            return None
        summary = f"keep-alive recovered after {self.summary(now)}"
        self.since, self.failures, self.last_error = None, 0, ""
        return summary

    def summary(self, now: float) -> str | None:
        """The run so far, in words (None if keep-alives are succeeding)."""
        if self.since is None:
            return None
        return (
            f"{self.failures} keep-alive(s) failed over {now - self.since:.1f} s "
            f"(last: {self.last_error})"
        )
