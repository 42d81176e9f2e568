"""``--logs-specs``: a torch ``LogsSpecs`` class (from the ``torchrun.logs_specs`` entry points)
decides where each worker's streams and error file go, as under torchrun.

Once per attempt the class's ``reify`` gets the local ranks' environments (``LOCAL_RANK``,
``RANK``, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``) and answers with torch's
``LogsDest``: per local rank a path for stdout and stderr (``""``: the console, ``os.devnull``:
nowhere), the streams also shown on the console (tee) and the error file. torch is imported
only when the flag is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aioelastic.agent._logs import StreamPlan
from aioelastic.agent._spec import Std, std_for


@dataclass(frozen=True, slots=True)
class WorkerLogs:
    """Where one worker's output and error file go, as a torch ``LogsSpecs`` decided."""

    stdout: StreamPlan
    stderr: StreamPlan
    error_file: str | None


Layout = Callable[[Mapping[int, Mapping[str, str]]], dict[int, WorkerLogs]]
"""Called once per attempt with each local rank's environment."""


def plan_of(path: str, tee: str | None, *, inherit: bool) -> StreamPlan:
    """One stream of a ``LogsDest``: console (``""``), nowhere (devnull), a file, tee'd or not."""
    if path == "":
        return StreamPlan(console=True, file=None, inherit=inherit)
    if path == os.devnull:
        return StreamPlan(console=False, file=None)
    return StreamPlan(console=tee is not None, file=Path(path))


def reified(dest: Any, local_ranks: range, *, inherit: bool) -> dict[int, WorkerLogs]:
    """Translate torch's ``LogsDest`` into a :class:`WorkerLogs` per local rank."""
    layout = {}
    for rank in local_ranks:
        error_file = dest.error_files.get(rank)
        layout[rank] = WorkerLogs(
            plan_of(dest.stdouts.get(rank, ""), dest.tee_stdouts.get(rank), inherit=inherit),
            plan_of(dest.stderrs.get(rank, ""), dest.tee_stderrs.get(rank), inherit=inherit),
            error_file if error_file and error_file != os.devnull else None,
        )
    return layout


def torch_layout(
    entry_point: Any,
    *,
    log_dir: str | None,
    redirects: Std | Mapping[int, Std],
    tee: Std | Mapping[int, Std],
    local_ranks_filter: frozenset[int] | None,
    local_world_size: int,
    inherit: bool,
) -> Layout:
    """Load ``entry_point`` (a torch ``LogsSpecs`` class) and build it as torchrun does."""
    from torch.distributed.elastic.multiprocessing.api import Std as TorchStd

    def torch_std(selector: Std | Mapping[int, Std]) -> Any:
        if isinstance(selector, Std):
            return TorchStd(int(selector))
        return {rank: TorchStd(int(std_for(selector, rank))) for rank in selector}

    specs = entry_point.load()(
        log_dir=log_dir,
        redirects=torch_std(redirects),
        tee=torch_std(tee),
        local_ranks_filter=set(local_ranks_filter) if local_ranks_filter else None,
    )

    def layout(envs: Mapping[int, Mapping[str, str]]) -> dict[int, WorkerLogs]:
        dest = specs.reify({rank: dict(env) for rank, env in envs.items()})
        return reified(dest, range(local_world_size), inherit=inherit)

    return layout
