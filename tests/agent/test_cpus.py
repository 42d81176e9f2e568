"""Counting usable CPUs: cgroup quotas (pure parsing, a fake cgroup tree) and the affinity mask."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aioelastic._launcher.cpus import cgroup_paths, cgroup_quota_cpus, quota_cpus, usable_cpu_count


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [
        ("max", "100000", None),
        ("-1", "100000", None),
        ("150000", "100000", 2),
        ("100000", "100000", 1),
        ("50000", "100000", 1),
        ("400000\n", "100000\n", 4),
        ("junk", "100000", None),
        ("0", "100000", None),
    ],
)
def test_quota_cpus(quota: str, period: str, expected: int | None) -> None:
    """A quota allows ceil(quota / period) CPUs; max, -1 or nonsense mean no limit."""
    assert quota_cpus(quota, period) == expected


def test_cgroup_paths_of_v1_v2_and_hybrid() -> None:
    """The unified path (hierarchy 0) and the v1 cpu controller's path are told apart."""
    text = "4:memory:/m\n3:cpu,cpuacct:/job\n0::/unified/job\n"
    assert cgroup_paths(text) == ("/unified/job", "/job")
    assert cgroup_paths("0::/\n") == ("/", None)


@pytest.mark.parametrize("version", [1, 2])
def test_the_quota_is_read_from_the_process_cgroup(tmp_path: Path, version: int) -> None:
    """cpu.max (v2) or cpu.cfs_quota_us with cpu.cfs_period_us (v1) of our own cgroup."""
    if version == 2:
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "cpu.max").write_text("150000 100000\n")
        proc = "0::/job\n"
    else:
        group = tmp_path / "cpu,cpuacct" / "job"
        group.mkdir(parents=True)
        (group / "cpu.cfs_quota_us").write_text("300000\n")
        (group / "cpu.cfs_period_us").write_text("100000\n")
        proc = "2:cpu,cpuacct:/job\n0::/\n"
    assert cgroup_quota_cpus(tmp_path, proc) == (2 if version == 2 else 3)


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    """A cgroup tree without the files (or not mounted) imposes nothing."""
    assert cgroup_quota_cpus(tmp_path, "0::/job\n") is None


def test_usable_cpu_count_is_within_the_affinity_mask() -> None:
    """The count never exceeds the CPUs this process may be scheduled on."""
    assert 1 <= usable_cpu_count() <= len(os.sched_getaffinity(0))
