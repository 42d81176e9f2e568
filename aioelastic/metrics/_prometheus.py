"""Prometheus metrics fed by the event stream, served over HTTP from the event loop.

:class:`PrometheusMetrics` is an event-stream subscriber that updates counters, gauges and a
histogram in its own registry; :func:`serve_metrics` answers scrapes on a TCP port with an
anyio listener (no thread). Needs the optional extra ``aioelastic[metrics]``
(``prometheus-client``).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import Listener, SocketAttribute, SocketStream, TaskStatus

from aioelastic._kinds.agent import (
    GroupRestarting,
    MembershipChanged,
    RendezvousCompleted,
    RendezvousJoining,
    StepTimes,
    TimeoutsLearnedIn,
    WorkerFailed,
    WorkerReaped,
)
from aioelastic._kinds.rendezvous import RendezvousWaiting
from aioelastic.events import EventRecord
from aioelastic.timer._events import ProcessExited, TimerAcquired, TimerExpired, TimerReleased

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

WAIT_STARTS = (RendezvousJoining, GroupRestarting, MembershipChanged)
"""Events after which an agent is back in rendezvous (the duration histogram's start)."""

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
"""Rendezvous duration buckets, in seconds."""

_REQUEST_LIMIT = 16384
"""Bytes of a scrape request read at most (the request line and headers)."""


class MetricsUnavailableError(ImportError):
    """prometheus-client is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "Prometheus metrics need prometheus-client: pip install 'aioelastic[metrics]'"
        )


class MetricsPortError(OSError):
    """The metrics port could not be bound."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(
            f"cannot serve metrics on {host}:{port}: {reason}; choose another --metrics-port "
            "(0 picks a free one)"
        )


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailableError() from None
    return prometheus_client


class PrometheusMetrics:
    """A subscriber keeping the job's metrics in ``registry`` (a new one by default).

    Metrics: ``aioelastic_restarts_total``, ``aioelastic_worker_failures_total``,
    ``aioelastic_watchdog_reaps_total``, ``aioelastic_membership_changes_total``,
    ``aioelastic_rendezvous_rounds_total``, ``aioelastic_rendezvous_duration_seconds``
    (histogram: from the start or a restart to the round's completion),
    ``aioelastic_world_size``, ``aioelastic_rendezvous_waiting_nodes`` (nodes joined while this
    one waits, from ``RendezvousWaiting`` reports, or :meth:`set_waiting_nodes`),
    ``aioelastic_active_timers`` (timer events seen), ``aioelastic_learned_timeout_seconds``
    (by scope, read from the learned-timeouts directories at each scrape),
    ``aioelastic_rank_step_seconds`` and ``aioelastic_rank_straggler_score`` (by rank: the
    median step time and score of the last straggler window), ``aioelastic_stragglers`` (the
    ranks that window named) and ``aioelastic_events_total`` by source and kind.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, start: float | None = None
    ) -> None:
        prom = _client()
        self.registry: CollectorRegistry = (
            registry if registry is not None else prom.CollectorRegistry()
        )
        reg = self.registry
        self.restarts = prom.Counter("aioelastic_restarts", "Worker group restarts", registry=reg)
        self.worker_failures = prom.Counter(
            "aioelastic_worker_failures", "Workers that failed", registry=reg
        )
        self.reaps = prom.Counter(
            "aioelastic_watchdog_reaps", "Workers signalled by the watchdog", registry=reg
        )
        self.membership_changes = prom.Counter(
            "aioelastic_membership_changes",
            "Rounds invalidated by a node joining or leaving",
            registry=reg,
        )
        self.rounds = prom.Counter(
            "aioelastic_rendezvous_rounds", "Rendezvous rounds completed", registry=reg
        )
        self.rendezvous_duration = prom.Histogram(
            "aioelastic_rendezvous_duration_seconds",
            "Seconds from (re)starting the rendezvous to the round's completion",
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.world_size = prom.Gauge(
            "aioelastic_world_size", "Workers in the current round (0 before one)", registry=reg
        )
        self.waiting_nodes = prom.Gauge(
            "aioelastic_rendezvous_waiting_nodes", "Nodes waiting to join", registry=reg
        )
        self.active_timers = prom.Gauge(
            "aioelastic_active_timers", "Watchdog timers armed now", registry=reg
        )
        self.events = prom.Counter(
            "aioelastic_events", "Events by source and kind", ["source", "kind"], registry=reg
        )
        self.learned_timeouts = prom.Gauge(
            "aioelastic_learned_timeout_seconds",
            'The limit expires(after="auto") gives each scope now',
            ["scope"],
            registry=reg,
        )
        self.rank_step_seconds = prom.Gauge(
            "aioelastic_rank_step_seconds",
            "A rank's median step time in the last straggler window (from world.step marks)",
            ["rank"],
            registry=reg,
        )
        self.rank_scores = prom.Gauge(
            "aioelastic_rank_straggler_score",
            "The fastest rank's median step time over this rank's (under 1/factor: a straggler)",
            ["rank"],
            registry=reg,
        )
        self.stragglers = prom.Gauge(
            "aioelastic_stragglers", "Ranks the last straggler window named", registry=reg
        )
        self._waiting_since = start
        self._timers: dict[tuple[int, str], float] = {}  # (pid, scope) -> monotonic deadline
        self._learned_dirs: list[str] = []

    def __repr__(self) -> str:
        return f"PrometheusMetrics({self.registry!r})"

    def set_waiting_nodes(self, count: int) -> None:
        """Record how many nodes wait to join (sampled by whoever can ask the rendezvous)."""
        self.waiting_nodes.set(count)

    def timers(self, now: float) -> list[dict[str, Any]]:
        """The armed watchdog timers, soonest first: pid, scope and seconds left at ``now``.

        ``now`` is on the watchdog's monotonic clock (the event loop's, in the same process).
        """
        return [
            {"pid": pid, "scope_id": scope, "seconds_left": round(deadline - now, 3)}
            for (pid, scope), deadline in sorted(self._timers.items(), key=lambda kv: kv[1])
        ]

    def learned(self) -> dict[str, dict[str, float]]:
        """The learned timeouts by scope (limit, observations, longest), read now from the
        directories the agents announced (``TimeoutsLearnedIn``): only when asked."""
        from aioelastic.timer._learned import LearningPolicy, learned_limit, merge, read_learned

        policy = LearningPolicy()
        scopes = merge(read_learned(directory) for directory in self._learned_dirs)
        return {
            name: {
                "limit": learned_limit(scope, policy),
                "observations": scope.observations,
                "longest": scope.longest,
            }
            for name, scope in sorted(scopes.items())
        }

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format (learned timeouts read at this moment)."""
        for scope, learned in self.learned().items():
            self.learned_timeouts.labels(scope).set(learned["limit"])
        data: bytes = _client().generate_latest(self.registry)
        return data

    def __call__(self, record: EventRecord) -> None:
        event = record.event
        self.events.labels(record.source, record.kind).inc()
        if self._waiting_since is None:
            self._waiting_since = record.time
        match event:
            case RendezvousWaiting():
                self.waiting_nodes.set(event.joined)
            case RendezvousCompleted():
                self.waiting_nodes.set(0)
                self.rounds.inc()
                self.world_size.set(event.world_size)
                self.rendezvous_duration.observe(max(0.0, record.time - self._waiting_since))
            case GroupRestarting():
                self.restarts.inc()
            case WorkerFailed():
                self.worker_failures.inc()
            case WorkerReaped():
                self.reaps.inc()
            case MembershipChanged():
                self.membership_changes.inc()
            case TimerAcquired():
                self._timers[(event.pid, event.scope_id)] = event.deadline
            case TimerReleased() | TimerExpired():
                self._timers.pop((event.pid, event.scope_id), None)
            case TimeoutsLearnedIn():
                if event.directory not in self._learned_dirs:
                    self._learned_dirs.append(event.directory)
            case StepTimes():
                for ranked in event.ranks:
                    self.rank_step_seconds.labels(str(ranked.rank)).set(ranked.median)
                    self.rank_scores.labels(str(ranked.rank)).set(ranked.score)
                self.stragglers.set(len(event.stragglers))
            case ProcessExited():
                self._timers = {k: d for k, d in self._timers.items() if k[0] != event.pid}
        if isinstance(event, WAIT_STARTS):
            self._waiting_since = record.time
        self.active_timers.set(len(self._timers))


async def metrics_listener(port: int, host: str = "0.0.0.0") -> Listener[SocketStream]:
    """Bind the metrics port; raise :class:`MetricsPortError` saying why it could not be."""
    try:
        return await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as error:
        raise MetricsPortError(host, port, error.strerror or str(error)) from None


async def serve_metrics(
    metrics: PrometheusMetrics,
    listener: Listener[SocketStream],
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer Prometheus scrapes on ``listener`` until cancelled; ``started`` gets the port."""
    async with listener:
        task_status.started(int(listener.extra(SocketAttribute.local_port)))

        async def answer(stream: SocketStream) -> None:
            async with stream:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    request = await read_request(stream)
                    await stream.send(response(request, metrics, anyio.current_time()))

        await listener.serve(answer)


async def read_request(stream: SocketStream) -> bytes:
    """Read a request's line and headers (a slow or huge request gets what arrived)."""
    request = b""
    with anyio.move_on_after(10):
        while b"\r\n\r\n" not in request and len(request) < _REQUEST_LIMIT:
            request += await stream.receive()
    return request


def response(request: bytes, metrics: PrometheusMetrics, now: float) -> bytes:
    """The HTTP response to ``request``: the metrics for ``GET /metrics`` (or ``/``), the armed
    watchdog timers as JSON for ``GET /timers`` (``now``: the watchdog's clock), the learned
    timeouts for ``GET /learned``, else 404."""
    method, _, rest = request.partition(b" ")
    path = rest.partition(b" ")[0].partition(b"?")[0]
    if method == b"GET" and path in (b"/", b"/metrics"):
        body, status, kind = metrics.exposition(), "200 OK", _client().CONTENT_TYPE_LATEST
    elif method == b"GET" and path == b"/timers":
        body, status, kind = json.dumps(metrics.timers(now)).encode(), "200 OK", "application/json"
    elif method == b"GET" and path == b"/learned":
        body, status, kind = json.dumps(metrics.learned()).encode(), "200 OK", "application/json"
    else:
        body, status, kind = b"not found: scrape /metrics\n", "404 Not Found", "text/plain"
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body
