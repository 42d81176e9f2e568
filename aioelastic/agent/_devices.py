"""Per-worker device settings of torchrun 2.13: ``--virtual-local-rank`` and
``--numa-binding``.

With a virtual local rank every worker sees ``LOCAL_RANK=0`` and only its own GPU, as device
0, through ``CUDA_VISIBLE_DEVICES`` (the agent's list, picked by local rank, or the local rank
itself). NUMA binding runs each worker under ``numactl`` bound to the CPUs near its GPU; the
CPUs are chosen by torch's own ``torch.numa.binding`` (the flag needs torch and one CUDA device
per local rank, and says so in one line where it cannot apply).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

NUMA_MODES = ("node", "socket", "exclusive", "core-complex")


class DeviceSettingError(ValueError):
    """A device flag cannot apply on this machine; the message says why."""


def visible_devices(value: str | None) -> list[str] | None:
    """The device ids in a ``CUDA_VISIBLE_DEVICES`` value (None: not set, every device)."""
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def check_virtual_local_rank(local_world_size: int, cuda_visible: str | None) -> None:
    """Refuse more local ranks than ``CUDA_VISIBLE_DEVICES`` lists devices."""
    devices = visible_devices(cuda_visible)
    if devices is not None and local_world_size > len(devices):
        raise DeviceSettingError(
            f"--virtual-local-rank: {local_world_size} workers per node but "
            f"CUDA_VISIBLE_DEVICES={cuda_visible!r} lists {len(devices)} devices"
        )


def virtual_local_rank_env(local_rank: int, cuda_visible: str | None) -> dict[str, str]:
    """The variables giving worker ``local_rank`` its own GPU as device 0."""
    devices = visible_devices(cuda_visible)
    device = str(local_rank) if devices is None else devices[local_rank]
    return {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": device}


def check_numa_binding(mode: str, local_world_size: int) -> None:
    """Refuse ``--numa-binding`` where it cannot apply: no torch, too few GPUs, no numactl."""
    try:
        import torch
    except ImportError:
        raise DeviceSettingError(f"--numa-binding {mode} needs torch installed") from None
    gpus = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    if gpus < local_world_size:
        raise DeviceSettingError(
            f"--numa-binding {mode} binds each worker to the CPUs near its GPU, and this "
            f"machine has {gpus} CUDA devices for {local_world_size} workers; without GPUs, "
            "bind CPUs with taskset or numactl around aioelastic run instead"
        )
    if shutil.which("numactl") is None:
        raise DeviceSettingError(f"--numa-binding {mode} needs numactl on PATH")


def numa_bound_argv(argv: Sequence[str], local_rank: int, mode: str) -> list[str]:
    """``argv`` run under ``numactl`` bound to the CPUs near GPU ``local_rank`` (torch's pick)."""
    from torch.numa.binding import (
        AffinityMode,
        NumaOptions,
        _maybe_wrap_command_args_with_numa_binding,
    )

    options = NumaOptions(affinity_mode=AffinityMode(mode))
    return list(
        _maybe_wrap_command_args_with_numa_binding(
            tuple(argv), gpu_index=local_rank, numa_options=options
        )
    )
