"""How many CPUs this process may really use: its affinity mask, capped by its cgroup's CPU
quota (``cpu.max`` on cgroup v2, ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` on v1).

``os.cpu_count()`` counts the machine's CPUs: under ``taskset -c 0`` or a container limited
to 1.5 CPUs it overcounts. torchrun counts the affinity mask only; the quota is ours too. The
parsing is pure; :func:`usable_cpu_count` reads the files.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cpus(quota: str, period: str) -> int | None:
    """CPUs a quota of ``quota`` µs per ``period`` µs allows, rounded up; None: no limit."""
    if quota.strip() in ("max", "-1"):
        return None
    try:
        allowed, per = int(quota), int(period)
    except ValueError:
        return None  # unreadable: no limit we can honour
    if allowed <= 0 or per <= 0:
        return None
    return max(1, math.ceil(allowed / per))


def cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """The process's (v2 unified, v1 ``cpu`` controller) cgroup paths from ``/proc/self/cgroup``."""
    unified = cpu = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            unified = path
        elif "cpu" in controllers.split(","):
            cpu = path
    return unified, cpu


def cgroup_quota_cpus(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """The CPU quota of this process's cgroup (its own; limits of ancestors are not summed)."""
    try:
        text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    unified, cpu = cgroup_paths(text)
    candidates: list[tuple[Path, Path | None]] = []
    if cpu is not None:
        for mount in (root / "cpu", root / "cpu,cpuacct"):
            base = mount / cpu.lstrip("/")
            candidates.append((base / "cpu.cfs_quota_us", base / "cpu.cfs_period_us"))
    if unified is not None:
        candidates.append((root / unified.lstrip("/") / "cpu.max", None))
    for quota_file, period_file in candidates:
        try:
            if period_file is None:
                quota, _, period = quota_file.read_text().partition(" ")
            else:
                quota, period = quota_file.read_text(), period_file.read_text()
        except OSError:
            continue
        return quota_cpus(quota, period or "100000")
    return None


def usable_cpu_count() -> int:
    """CPUs this process may use: its affinity, capped by its cgroup quota; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:  # pragma: no cover - not Linux
        count = os.cpu_count() or 1
    quota = cgroup_quota_cpus()
    return max(1, min(count, quota) if quota is not None else count)
