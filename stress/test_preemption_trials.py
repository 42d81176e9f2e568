"""Preemption, over and over: three network-namespace hosts, two gloo workers each on the worker
API; SIGTERM to a random agent mid-training. Every trial must end with all six ranks saved at
one step and every agent exiting preempted (``AIOELASTIC_PREEMPTIONS`` trials per backend,
default 20). Figures, as each agent measured from its notice: until every local rank was told to
stop, and until its last worker exited (saved)."""

from __future__ import annotations

import importlib.util
import os
import random
import time

import pytest

from aioelastic.testing import unavailable_reason
from stress.conftest import Figures
from stress.test_partitions import summary
from tests.network._preemption import API_WORKER, trial
from tests.network.test_preemption import check_saved_at_one_step

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(3600), pytest.mark.torch]

TRIALS = int(os.environ.get("AIOELASTIC_PREEMPTIONS", "20"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
async def test_every_trial_saves_every_rank_at_one_step(backend: str, figures: Figures) -> None:
    """TRIALS trials: each one all six ranks saved at one step, every agent exited preempted."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be made: {reason}")
    rng = random.Random(f"preempt-{backend}")
    to_last_save: list[float] = []
    to_stopping: list[float] = []
    passed = 0
    started = time.monotonic()
    for _ in range(TRIALS):
        signalled = rng.randrange(3)
        async with trial(gloo=True) as t:
            await t.start(backend, API_WORKER)
            statuses = await t.preempt(t.net.hosts[signalled])
            check_saved_at_one_step(t, statuses, signalled)
            ends = [t.events(host, "PreemptionEnded")[0] for host in t.net.hosts]
            to_last_save += [end["since_notice"] for end in ends]
            to_stopping += [end["all_stopping"] for end in ends]
        passed += 1
    figures["trials passed"] = f"{passed} of {TRIALS}"
    figures["notice to every local rank stopping (s, per agent)"] = summary(to_stopping)
    figures["notice to last worker exited, saved (s, per agent)"] = summary(to_last_save)
    figures["wall (s)"] = round(time.monotonic() - started, 1)
