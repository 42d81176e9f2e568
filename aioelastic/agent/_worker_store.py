"""The torch store an agent's workers use: ``TORCHELASTIC_USE_AGENT_STORE=True``, as torchrun.

Torch's ``init_process_group(init_method="env://")`` opens ``TCPStore(MASTER_ADDR,
MASTER_PORT, is_master=False)`` when that variable is ``True``, so no worker binds a port and
no worker's death takes the store away. Two arrangements:

* **Loopback (the default).** Each agent serves torch's protocol on ``127.0.0.1`` to its own
  workers, relayed to the job's store (the round's store of any backend: the TCP store, etcd,
  static). Workers get ``MASTER_ADDR=127.0.0.1`` and that listener's port. Only the job's own
  (authenticated) store connection crosses the network.
* **Exposed (``--expose-torch-store``).** torchrun's arrangement: the hosting agent serves
  torch's protocol on the network and every worker gets its address. Static jobs get exactly
  ``--master-addr``/``--master-port``: the job's store server there speaks torch's protocol
  too. Elastic jobs get the round's bootstrap address and port, where group rank 0 listens.
  Anyone who reaches that port can read and write every key: torch clients send no token.

Each attempt gets a clean keyspace, so the fixed keys ``init_process_group`` writes
(``default_pg/...``) never meet a previous attempt's: the round's store (private to its round;
a static job's restart is a round of its own) under ``torch/``. The exposed static store is
torchrun's exactly: its root, which the static backend clears between attempts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from aioelastic._service import Service
from aioelastic.agent._env import RoundInfo
from aioelastic.agent._errors import WorkerSpecError
from aioelastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousParameters
from aioelastic.rendezvous._security import store_is_protected
from aioelastic.rendezvous._static import StaticRendezvousHandler
from aioelastic.store import MemoryStore, PrefixStore, Store, TorchStoreListener

LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = "0.0.0.0"  # only with --expose-torch-store


def torch_store_arrangement(mode: str, params: RendezvousParameters) -> str:
    """Resolve ``aioelastic run``'s ``auto`` arrangement: ``expose`` (torchrun's) or ``loopback``.

    Where the job's store is open anyway (no token, no TLS), workers reach it as torchrun's
    do: the exposed arrangement adds nothing an attacker lacks, and hands workers the address
    torchrun would. A token or TLS protects the job's store from the network, and torch's
    clients can send neither, so there each agent relays its own workers on loopback. A
    single-node job (``--standalone``: the in-process backend) has no network side: loopback.
    """
    if mode != "auto":
        return mode
    if params.backend == "memory" or store_is_protected(params):
        return "loopback"
    return "expose"


class WorkerStore(Service):
    """Serves the workers' torch store for every attempt of one agent's run."""

    def __init__(self, handler: RendezvousHandler, *, expose: bool = False) -> None:
        if expose and isinstance(handler, StaticRendezvousHandler) and handler.secured:
            raise WorkerSpecError(
                "torch_store",
                "expose",
                "--expose-torch-store cannot share a static job's store secured by a token or "
                "TLS: torch's clients can send neither; drop the flag (each agent then serves "
                "its own workers on loopback) or run the store without a token",
            )
        self.handler = handler
        self.expose = expose
        self._local = TorchStoreListener(MemoryStore(), LOOPBACK, native=True)  # store: per attempt

    @property
    def listener(self) -> TorchStoreListener:
        """The loopback listener (serving only in the default arrangement)."""
        return self._local

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the loopback listener until cancelled (exposed ones live in :meth:`attempt`)."""
        if self.expose:
            task_status.started()
            await anyio.sleep_forever()
        await self._local.serve(task_status=task_status)

    @asynccontextmanager
    async def attempt(self, info: RendezvousInfo, workers: RoundInfo) -> AsyncIterator[RoundInfo]:
        """Serve one attempt's store; yield ``workers`` pointing at it (the agent's store on)."""
        round_store: Store = info.store
        scoped = PrefixStore("torch", round_store)
        if not self.expose:
            self._local.use_store(scoped)
            yield dataclasses.replace(
                workers, master_addr=LOOPBACK, master_port=self._local.port, use_agent_store=True
            )
            return
        if isinstance(self.handler, StaticRendezvousHandler):
            host, port = self.handler.endpoint
            yield dataclasses.replace(
                workers, master_addr=host, master_port=port, use_agent_store=True
            )
            return
        if info.rank != 0:
            yield dataclasses.replace(workers, use_agent_store=True)
            return
        port = info.bootstrap_store_info.master_port
        exposed = TorchStoreListener(scoped, EVERY_INTERFACE, port, expose=True, native=True)
        async with exposed:
            yield dataclasses.replace(workers, use_agent_store=True)
