"""What the rendezvous and the agent report, as data: their event types, below every reader.

The parts above the event stream keep their event dataclasses here rather than in their own
packages, so that whatever reads events (``aioelastic.events``, its log, goodput and timeline
views, ``aioelastic.metrics``) reads them from a layer below it, without importing the part
that emits them. Each part re-exports its own: ``aioelastic.agent.WorkerFailed`` is
``aioelastic._kinds.agent.WorkerFailed``. Nothing here does I/O or imports another part; the
timer, which sits below the stream, keeps its events in ``aioelastic/timer/_events.py``.
"""
