"""Torch's own ``TCPStore`` clients in a process of their own, driven one line at a time.

Some of torch's client calls block in ``recv`` holding the GIL, so a torch client cannot share
a process with a Python server it talks to. Run as a script, each stdin line is a Python
expression evaluated with ``connect``, ``clients``, ``dist`` and ``timedelta`` in scope, and each
stdout line a JSON object: ``{"value": repr(result)}`` or ``{"error": type, "message": text}``.
:class:`TorchClientProcess` drives it from a test.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from datetime import timedelta
from typing import Any

import anyio
import anyio.to_thread

_CALL_BOUND = 120.0
"""Seconds one call may take: torch's import alone takes several on a loaded machine."""


class TorchCallError(Exception):
    """A call raised in the torch client process."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


class TorchClientProcess:
    """A child process holding torch ``TCPStore`` clients; ``await proc("expr")`` runs one call."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._exchange_line("")  # the child's "ready" line, once torch is imported

    def _exchange_line(self, expression: str) -> Any:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        if expression:
            self.process.stdin.write(expression.replace("\n", " ") + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the torch client process exited ({self.process.poll()})")
        answer = json.loads(line)
        if "error" in answer:
            raise TorchCallError(answer["error"], answer["message"])
        return ast.literal_eval(answer["value"])

    async def __call__(self, expression: str) -> Any:
        """Evaluate ``expression`` in the child (blocking there, not in this event loop)."""
        with anyio.fail_after(_CALL_BOUND):
            return await anyio.to_thread.run_sync(
                self._exchange_line, expression, abandon_on_cancel=True
            )

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


# -- the child -------------------------------------------------------------------------------

clients: dict[str, Any] = {}


def connect(name: str, port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    """Open a torch client (``is_master=False``) named ``name`` to ``host:port``."""
    import torch.distributed as dist

    clients[name] = dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False
    )


def main() -> None:
    import torch.distributed as dist

    scope = {"connect": connect, "clients": clients, "dist": dist, "timedelta": timedelta}
    print(json.dumps({"value": "'ready'"}), flush=True)
    for line in sys.stdin:
        try:
            answer = {"value": repr(eval(line, scope))}
        except Exception as error:
            answer = {"error": type(error).__name__, "message": str(error)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
