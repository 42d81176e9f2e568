"""Torch's requests as typed values and the one table that answers them: every op has its
class and its handler, keys arrive as store keys, and a store failing under a held ``WAIT``
closes that connection only (raw protocol bytes, no torch needed)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from aioelastic.store import MemoryStore, StoreConnectionError, TorchStoreListener
from aioelastic.store._torch_codec import TorchField, TorchOp, TorchRequest, encode_request
from aioelastic.store._torch_requests import (
    TorchMultiSet,
    TorchSet,
    TorchWait,
    typed_request,
)
from aioelastic.store._torch_session import HANDLERS

pytestmark = pytest.mark.anyio

SAMPLE_FIELDS: dict[TorchOp, tuple[TorchField, ...]] = {
    TorchOp.VALIDATE: (0x3C85F7CE,),
    TorchOp.SET: ("/k", b"v"),
    TorchOp.COMPARE_SET: ("/k", b"", b"v"),
    TorchOp.GET: ("/k",),
    TorchOp.ADD: ("/k", 1),
    TorchOp.CHECK: (["/k"],),
    TorchOp.WAIT: (["/k"],),
    TorchOp.GETNUMKEYS: (),
    TorchOp.DELETE_KEY: ("/k",),
    TorchOp.APPEND: ("/k", b"v"),
    TorchOp.MULTI_GET: (["/k"],),
    TorchOp.MULTI_SET: ([("/k", b"v")],),
    TorchOp.CANCEL_WAIT: (),
    TorchOp.PING: (5,),
    TorchOp.QUEUE_PUSH: ("/q", b"v"),
    TorchOp.QUEUE_POP: ("/q",),
    TorchOp.QUEUE_LEN: ("/q",),
    TorchOp.LIST_KEYS: (),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("op", list(TorchOp))
def test_every_op_has_its_class_and_the_table_answers_it_as_that_op(op: TorchOp) -> None:
    """Each op builds a request of its own class, which the one table answers as that op."""
    request = typed_request(TorchRequest(op, SAMPLE_FIELDS[op]))
    assert HANDLERS[type(request)].op is op
    others = [o for o in TorchOp if o is not op]
    assert all(
        type(typed_request(TorchRequest(o, SAMPLE_FIELDS[o]))) is not type(request) for o in others
    )


def test_keys_arrive_as_store_keys() -> None:
    """torch's leading ``/`` is removed from every key a request carries (once)."""
    assert typed_request(TorchRequest(TorchOp.SET, ("//k", b"v"))) == TorchSet("/k", b"v")
    assert typed_request(TorchRequest(TorchOp.WAIT, (["/a", "b"],))) == TorchWait(["a", "b"])
    pairs = [("/a", b"1"), ("/b", b"2")]
    assert typed_request(TorchRequest(TorchOp.MULTI_SET, (pairs,))) == TorchMultiSet(
        ["a", "b"], [b"1", b"2"]
    )


class FailingWaits(MemoryStore):
    """A store whose waits fail once they start (the store went away under them)."""

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        raise StoreConnectionError("memory://test", "it went away")


async def test_a_store_failing_under_a_held_wait_closes_that_connection_only() -> None:
    """The failure of the wait's store call drops its connection with a count; the listener
    and its other connections go on."""
    validate = encode_request(TorchRequest(TorchOp.VALIDATE, (0x3C85F7CE,)))
    async with FailingWaits() as store, TorchStoreListener(store) as listener:
        with anyio.fail_after(30):
            async with await anyio.connect_tcp("127.0.0.1", listener.port) as waiting:
                await waiting.send(validate + encode_request(TorchRequest(TorchOp.WAIT, (["/x"],))))
                with pytest.raises(anyio.EndOfStream):
                    await waiting.receive()
            async with await anyio.connect_tcp("127.0.0.1", listener.port) as other:
                await other.send(validate + encode_request(TorchRequest(TorchOp.PING, (7,))))
                assert await other.receive() == (7).to_bytes(4, "little")
        assert listener.statistics().dropped_connections == 1
