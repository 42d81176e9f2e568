"""A public test kit: a manual clock today; in-memory clusters and fault injection as they land."""

from aioelastic.testing._clock import ManualClock

__all__ = ["ManualClock"]
