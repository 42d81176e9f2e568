"""A worker that loads an installed package with compiled code (uvloop, as torch would be),
says who its parent is, and on its first start fails once the test says so (a line on the
FIFO ``argv[1]``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvloop  # noqa: F401

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
path = os.environ.get("PYTHONPATH")
print(f"restart {restart} pid {os.getpid()} ppid {os.getppid()} path {path}", flush=True)
if restart == 0:
    Path(sys.argv[1]).read_text()  # blocks until the test writes the go
    sys.exit(3)
