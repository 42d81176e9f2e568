"""Which event loop runs: the hot paths use asyncio's callbacks directly where they can."""

from __future__ import annotations

import asyncio


def on_asyncio() -> bool:
    """Return whether the running event loop is asyncio's (stock or uvloop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
