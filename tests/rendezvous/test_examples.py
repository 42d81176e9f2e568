"""The rendezvous examples run and print what their docstrings promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_memory_example_re_forms_the_round_with_the_late_node() -> None:
    """rendezvous_memory.py: 3 nodes, then 4 after the late node invalidates the round."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "rendezvous_memory.py")],
        capture_output=True,
        text=True,
        timeout=60,  # generous: the example needs well under a second
        check=True,
    )
    lines = done.stdout.splitlines()
    assert sorted(line for line in lines if line.endswith("of 3")) == [
        "a: rank 0 of 3",
        "b: rank 1 of 3",
        "c: rank 2 of 3",
    ]
    assert "a: NODES_WAITING: 1 node(s) are waiting to join round 2" in lines
    assert sorted(line for line in lines if line.endswith("of 4")) == [
        "a: rank 0 of 4",
        "b: rank 1 of 4",
        "c: rank 2 of 4",
        "d: rank 3 of 4",
    ]


def test_secure_rendezvous_example_refuses_the_intruder_and_forms_the_world() -> None:
    """secure_rendezvous.py: the node without the token is refused; the two with it join."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "secure_rendezvous.py")],
        capture_output=True,
        text=True,
        timeout=60,  # generous: the example needs about a second
        check=True,
    )
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("intruder refused:") and "requires a token" in line for line in lines
    )
    assert sorted(line for line in lines if line.startswith("joined:")) == [
        "joined: rank 0 of 2",
        "joined: rank 1 of 2",
    ]


def test_scale_example_forms_and_re_forms_a_large_job() -> None:
    """rendezvous_scale.py: N nodes form, one crashes, N - 1 re-form; calls per node stay small."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "rendezvous_scale.py"), "500"],
        capture_output=True,
        text=True,
        timeout=300,  # generous: a few seconds on a loaded machine
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "formed: 500 nodes, world size 500"
    assert lines[2] == "re-formed: 499 nodes, world size 499"
    calls = [float(line.rsplit(" ", 1)[1]) for line in (lines[1], lines[3])]
    assert all(0 < count < 20 for count in calls)


def test_clean_ending_example_closes_every_node_and_names_the_lost_host() -> None:
    """rendezvous_clean_ending.py: every node CLOSED; after the host left, the others say so."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "rendezvous_clean_ending.py")],
        capture_output=True,
        text=True,
        timeout=60,  # generous: the example needs a few seconds
        check=True,
    )
    lines = done.stdout.splitlines()
    assert sorted(lines[:3]) == ["a: CLOSED", "b: CLOSED", "c: CLOSED"]
    assert sorted(lines[3:]) == [
        "b: PARTICIPANT_LOST",
        "b: the store's host was lost",
        "c: PARTICIPANT_LOST",
        "c: the store's host was lost",
    ]
    assert done.stderr == ""
