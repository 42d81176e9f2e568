"""``--logs-specs``: a torch ``LogsSpecs`` class (from the ``torchrun.logs_specs`` entry points)
decides where each worker's streams and error file go, as under torchrun.

Once per attempt the class's ``reify`` gets the local ranks' environments (``LOCAL_RANK``,
``RANK``, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``) and answers with torch's
``LogsDest``: per local rank a path for stdout and stderr (``""``: the console, ``os.devnull``:
nowhere), the streams also shown on the console (tee), the error file and where the
``--duplicate-*-filters`` copies go. As under torchrun, what ``reify`` changes in those
environments reaches the workers (torch's own sets ``TORCHELASTIC_ERROR_FILE`` that way; a key
it removes is not removed). torch is imported only when the flag is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    env: Mapping[str, str] = field(default_factory=dict)
    """What ``reify`` set in this rank's environment (added or changed keys)."""
    filtered_stdout: Path | None = None
    """The attempt's ``--duplicate-stdout-filters`` copy (the same for every rank)."""
    filtered_stderr: Path | None = None


Layout = Callable[[Mapping[int, Mapping[str, str]]], dict[int, WorkerLogs]]
"""Called once per attempt with each local rank's environment."""


def plan_of(path: str, tee: str | None, *, inherit: bool) -> StreamPlan:
    """One stream of a ``LogsDest``: console (``""``), nowhere (devnull), a file, tee'd or not."""
    if path == "":
        return StreamPlan(console=True, file=None, inherit=inherit)
    if path == os.devnull:
        return StreamPlan(console=False, file=None)
    return StreamPlan(console=tee is not None, file=Path(path))


def reified(
    dest: Any,
    local_ranks: range,
    *,
    inherit: bool,
    envs: Mapping[int, Mapping[str, str]] | None = None,
    given: Mapping[int, Mapping[str, str]] | None = None,
) -> dict[int, WorkerLogs]:
    """Translate torch's ``LogsDest`` into a :class:`WorkerLogs` per local rank; ``envs`` are
    the environments ``reify`` was handed, as it left them, ``given`` as they were before."""
    layout = {}
    filtered = [
        _filtered(getattr(dest, name, "")) for name in ("filtered_stdout", "filtered_stderr")
    ]
    for rank in local_ranks:
        error_file = dest.error_files.get(rank)
        after, before = (envs or {}).get(rank, {}), (given or {}).get(rank, {})
        layout[rank] = WorkerLogs(
            plan_of(dest.stdouts.get(rank, ""), dest.tee_stdouts.get(rank), inherit=inherit),
            plan_of(dest.stderrs.get(rank, ""), dest.tee_stderrs.get(rank), inherit=inherit),
            error_file if error_file and error_file != os.devnull else None,
            {key: value for key, value in after.items() if before.get(key) != value},
            *filtered,
        )
    return layout


def _filtered(path: str) -> Path | None:
    """A ``LogsDest`` filtered-copy path, unless it is none or under ``os.devnull``."""
    if not path or path == os.devnull or path.startswith(os.devnull + os.sep):
        return None
    return Path(path)


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
        handed = {rank: dict(env) for rank, env in envs.items()}
        dest = specs.reify(handed)
        return reified(dest, range(local_world_size), inherit=inherit, envs=handed, given=envs)

    return layout
