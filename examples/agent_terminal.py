"""A worker that uses the terminal: ``isatty()``, a ``\\r`` progress bar, and ``input()``.

Under ``aioelastic run`` (as under torchrun) workers inherit the launcher's stdin, stdout and
stderr, so prompts, ``breakpoint()``/pdb, colours and progress bars work:

    aioelastic run --standalone --nproc-per-node 1 examples/agent_terminal.py

With ``-t 3`` the output is relayed with a rank prefix instead, and a partial line still shows
at once.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    ttys = " ".join(
        f"{name}={os.isatty(fd)}" for fd, name in enumerate(("stdin", "stdout", "stderr"))
    )
    print(f"rank {os.environ['RANK']}: {ttys}", flush=True)
    for percent in (0, 50, 100):
        sys.stdout.write(f"\rprogress {percent:3d}%")  # redrawn in place, no newline
        sys.stdout.flush()
    print()
    if os.isatty(0):
        answer = input("continue? ")
        print(f"answered {answer!r}", flush=True)


if __name__ == "__main__":
    main()
