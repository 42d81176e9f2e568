"""A worker that kills its fork template once (its parent, when that is the template): the
template dies with every worker of the attempt; the agent restarts the group and the template."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

cmdline = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0 and os.environ["RANK"] == "0" and b"_template_main.py" in cmdline:
    os.kill(os.getppid(), signal.SIGKILL)
    signal.pause()
sys.stdout.write(f"done rank={os.environ['RANK']} attempt={attempt}\n")
