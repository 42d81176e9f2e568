"""A worker that says whether a module of the tests' own was loaded when it started; on its
first start it then imports that module (pure Python: not in its maps) and waits to be killed."""

from __future__ import annotations

import os
import signal
import sys

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
had = "lazy_marker" in sys.modules
print(f"restart {restart} pid {os.getpid()} ppid {os.getppid()} had {had}", flush=True)
if restart == 0:
    import lazy_marker  # noqa: F401

    print("imported lazy_marker", flush=True)
    signal.pause()  # until the test kills this worker
