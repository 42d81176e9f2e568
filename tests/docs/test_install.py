"""Installing from a clone into an existing environment, as the README and quick start say."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import aioelastic

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", ROOT / "docs" / "quickstart.md")


def pyproject_extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def setuptools_can_build() -> bool:
    """Whether this environment can build the wheel offline (pyproject needs setuptools>=77)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 77


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_extras_the_install_pages_name_exist(page: Path) -> None:
    """Every extra an install page names (`[etcd,metrics]`, a table row) is in pyproject.toml."""
    text = page.read_text()
    named = {e for group in re.findall(r"\[([a-z,]+)\]'", text) for e in group.split(",")}
    named |= set(re.findall(r"^\| `([a-z]+)`", text, re.MULTILINE))
    assert named >= {"etcd", "metrics"}
    assert named - pyproject_extras() == set()


@pytest.mark.skipif(not setuptools_can_build(), reason="needs setuptools>=77 to build offline")
def test_a_wheel_built_from_the_clone_installs_next_to_this_environment(tmp_path: Path) -> None:
    """The wheel the pages name builds with its extras; installed over this environment, it runs."""
    source = tmp_path / "aioelastic"
    shutil.copytree(ROOT / "aioelastic", source / "aioelastic")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", "dist", "./aioelastic"],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=300,  # generous: a build takes seconds
    )
    wheel_name = f"aioelastic-{aioelastic.__version__}-py3-none-any.whl"
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel_name]
    assert all(f"dist/{wheel_name}[etcd,metrics]" in page.read_text() for page in PAGES)
    with zipfile.ZipFile(tmp_path / "dist" / wheel_name) as wheel:
        metadata = wheel.read(f"aioelastic-{aioelastic.__version__}.dist-info/METADATA").decode()
    assert {"etcd", "metrics", "timeline", "uvloop"} <= set(
        re.findall(r"^Provides-Extra: (\S+)$", metadata, re.MULTILINE)
    )
    assert 'Requires-Dist: aetcd>=1.0; extra == "etcd"' in metadata
    target = tmp_path / "site-packages"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), f"dist/{wheel_name}"],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=300,
    )
    env["PYTHONPATH"] = str(target)
    found = subprocess.run(
        [sys.executable, "-c", "import aioelastic; print(aioelastic.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert found.stdout.startswith(str(target)), found.stdout
    helped = subprocess.run(
        [str(target / "bin" / "aioelastic"), "run", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: aioelastic run"), helped.stdout
