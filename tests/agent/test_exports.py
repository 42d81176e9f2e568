"""The agent's public surface is exactly what we meant to publish."""

from __future__ import annotations

import inspect

import aioelastic.agent
import aioelastic.errors


def test_agent_all_lists_public_names_that_exist() -> None:
    """Every name in __all__ exists, is public, and comes from a private module."""
    for name in aioelastic.agent.__all__:
        obj = getattr(aioelastic.agent, name)
        assert not name.startswith("_")
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert obj.__module__.startswith("aioelastic.agent._"), name
    assert sorted(aioelastic.agent.__all__) == aioelastic.agent.__all__


def test_agent_core_names_are_public() -> None:
    """The names the README and the cross-part contract use are exported."""
    assert {"ElasticAgent", "WorkerSpec", "LogSpec", "Std", "RunResult", "RunState"} <= set(
        aioelastic.agent.__all__
    )


def test_errors_module_exports_record() -> None:
    """aioelastic.errors publishes the worker-side decorator and its helpers."""
    assert aioelastic.errors.__all__ == [
        "ERROR_FILE_ENV",
        "error_file_payload",
        "record",
        "write_error_file",
    ]
