"""A worker that reports, as one JSON line, what a forked worker must look like.

Its process ids, ``argv``, ``sys.path[0]``, ``__main__``, its descriptors, draws from each
random generator, and which modules it found already imported (``--preload`` tests).
"""

from __future__ import annotations

import json
import os
import random
import sys

PRELOADED = sorted(m for m in ("preload_marker", "fractions") if m in sys.modules)


def main() -> None:
    links = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            links[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    numpy = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    report = {
        "rank": int(os.environ["RANK"]),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "path0": sys.path[0],
        "main": __name__,
        "file": __file__,
        "fds": links,
        "steps_fd": os.environ.get("AIOELASTIC_STEPS_FD"),
        "preloaded": PRELOADED,
        "random": random.random(),
        "numpy": None if numpy is None else float(numpy.random.random()),
        "torch": None if torch is None else float(torch.rand(1).item()),
    }
    sys.stdout.write(f"probe {json.dumps(report)}\n")


if __name__ == "__main__":
    main()
