"""A subscriber that keeps every event record, so tests assert on events instead of log text."""

from __future__ import annotations

import anyio

from aioelastic.events import EventRecord


class EventRecorder:
    """Subscribe it to an :class:`~aioelastic.events.EventStream`; wait for and inspect records.

    ```python
    recorder = EventRecorder()
    stream.subscribe(recorder)
    await recorder.wait_for(WorkerFailed)
    assert recorder.kinds() == ["RendezvousCompleted", "WorkersStarted", "WorkerFailed"]
    ```
    A kind is an event type (instances of it and of its subclasses match) or, for events a test
    cannot import, a class name.
    """

    def __init__(self) -> None:
        self.records: list[EventRecord] = []
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        return f"EventRecorder({len(self.records)} records)"

    def __call__(self, record: EventRecord) -> None:
        self.records.append(record)
        self._changed.set()
        self._changed = anyio.Event()

    def kinds(self, source: str | None = None) -> list[str]:
        """The kinds recorded so far (only from ``source`` if given), in order."""
        return [r.kind for r in self.records if source is None or r.source == source]

    def of(self, kind: type | str, *, node: str | None = None) -> list[EventRecord]:
        """The records of ``kind`` (from ``node`` if given), in order."""
        return [r for r in self.records if _matches(r, kind) and node in (None, r.node)]

    async def wait_for(
        self, kind: type | str, count: int = 1, *, node: str | None = None
    ) -> EventRecord:
        """Return the ``count``-th record of ``kind`` (from ``node``), waiting until it arrives."""
        while len(found := self.of(kind, node=node)) < count:
            await self._changed.wait()
        return found[count - 1]


def _matches(record: EventRecord, kind: type | str) -> bool:
    return record.kind == kind if isinstance(kind, str) else isinstance(record.event, kind)
