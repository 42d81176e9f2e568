"""Fixtures for the reliability tests, reused from the parts' own test packages."""

from __future__ import annotations

from tests.timer.conftest import recorder, spawn

__all__ = ["recorder", "spawn"]
