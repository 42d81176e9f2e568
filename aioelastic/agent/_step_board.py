"""This node's straggler board, live: step marks in, scored windows and stragglers out.

The agent hands every :class:`StepsMarked` event to :meth:`StepBoard.feed`; the scoring is
``aioelastic/events/_stragglers.py`` (pure, shared with ``aioelastic report``). Each closed
window is emitted as :class:`StepTimes`, each rank that became a straggler in it as
:class:`StragglerDetected`, and :meth:`StepBoard.show` keeps the last window in the round's
store, where ``aioelastic status`` reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from aioelastic.agent._events import AgentEvent, StepsMarked, StepTimes, StragglerDetected
from aioelastic.agent._status import encode_step_times, step_times_key
from aioelastic.events._stragglers import ScoredWindow, StragglerSettings, StragglerWatch
from aioelastic.store import Store, StoreError

logger = logging.getLogger(__name__)


class StepBoard:
    """Scores this node's ranks' step marks and reports each closed window."""

    def __init__(self, settings: StragglerSettings, emit: Callable[[AgentEvent], None]) -> None:
        self._watch = StragglerWatch(settings)
        self._emit = emit
        self._straggling: frozenset[int] = frozenset()
        self._changed: anyio.Event | None = None
        self.latest: StepTimes | None = None
        """The last window this node's workers' step marks closed."""

    def feed(self, event: StepsMarked) -> None:
        """Take one batch of a rank's step marks; report every window it closes."""
        life = (event.restart_count, event.generation)
        for window in self._watch.feed(life, event.rank, event.steps, event.times, event.done):
            self._scored(window)

    async def show(self, where: Callable[[], tuple[Store, int] | None]) -> None:
        """Keep the last window in the store ``where()`` names with this node's rank in its
        round (None between rounds), until cancelled."""
        self._changed = anyio.Event()
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()  # a window closed while we write is written next
            times, place = self.latest, where()
            if times is None or place is None:
                continue
            store, node = place
            medians = {r.rank: r.median for r in times.ranks}
            value = encode_step_times(times.end, medians, times.factor)
            try:
                await store.set(step_times_key(node), value)
            except StoreError as exc:  # the status display is not worth failing a job
                logger.info("could not show the step times in the store: %s", exc)

    def _scored(self, window: ScoredWindow) -> None:
        """Report a closed window, and each rank that became a straggler in it (a rank stays
        one until a window compares it with others and does not name it)."""
        factor = self._watch.settings.factor
        times = StepTimes(window.start, window.end, window.ranks, window.stragglers, factor)
        self.latest = times
        if self._changed is not None:
            self._changed.set()
        self._emit(times)
        fastest = min((r.median for r in window.ranks), default=0.0)
        for ranked in window.ranks:
            if ranked.rank in window.stragglers and ranked.rank not in self._straggling:
                self._emit(
                    StragglerDetected(ranked.rank, ranked.score, ranked.median, fastest, window.end)
                )
        compared = {r.rank for r in window.ranks} if len(window.ranks) > 1 else set()
        self._straggling = (self._straggling - compared) | set(window.stragglers)
