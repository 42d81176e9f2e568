"""Counted writes on etcd: puts and the number of keys under a prefix, in one transaction.

Theory of operation. etcd cannot increment a counter without a compare, and a compare makes
concurrent writers conflict and retry. A counted write sends its puts, then a count-only range
read of the prefix, in one transaction with no compare: etcd reads a transaction's own writes,
so the count includes them, and the key count stands in for the counter
(``EtcdStore.multi_set_and_count``). Concurrent calls on one prefix share a transaction
(:class:`~aioelastic.store._etcd_combine.CountedWrites` gathers them), each count right after
its own puts; a write may also ask for a range read at the end of the same transaction.

A lost reply is recovered without counting twice: if the write's first key under the prefix
holds its new value, the count (and the read) is taken at that key's revision (with a shared
transaction, the writes after it in the same transaction count too); else the write is sent
again, until the retry time runs out.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio

from aioelastic.store._api import Snapshot
from aioelastic.store._etcd_combine import CountedWrite
from aioelastic.store._etcd_rpc import EtcdConnection, Member, first_kv, grpc, is_retryable, rpc
from aioelastic.store._etcd_txn import range_end


class Txn(Protocol):
    """Send one transaction request (``what`` names it in errors)."""

    async def __call__(self, what: str, request: Any, *, idempotent: bool = True) -> Any: ...


def snapshot(data: bytes, revision: int, response_range: Any) -> Snapshot:
    """The keys of a range read under the job's ``data`` prefix, as the Store API names them."""
    cut = len(data)
    return Snapshot(revision, {kv.key[cut:].decode(): kv.value for kv in response_range.kvs})


class CountedSender:
    """Sends the shared transactions of counted writes for one store (``data``: its key prefix)."""

    def __init__(self, conn: EtcdConnection, data: bytes, txn: Txn) -> None:
        self._conn = conn
        self._data = data
        self._txn = txn

    async def send(self, head: bytes, batch: list[CountedWrite]) -> list[int]:
        """Send ``batch``, the writes counted under ``head``; return each write's count and set
        the snapshot of each write that reads."""
        end = range_end(head)
        count = rpc.RangeRequest(key=head, range_end=end, count_only=True)
        counts: list[int | None] = [None] * len(batch)
        deadline = anyio.current_time() + self._conn.retry_timeout
        while True:
            request = rpc.TxnRequest()
            written: set[bytes] = set()
            reads: list[bytes] = []
            for entry, found in zip(batch, counts, strict=True):
                if found is not None:
                    continue
                for key, value in entry.puts.items():
                    if key not in written:
                        put = request.success.add().request_put
                        put.key, put.value = key, value
                        written.add(key)
                request.success.add().request_range.CopyFrom(count)
                if entry.read is not None and entry.read not in reads:
                    reads.append(entry.read)
            for prefix in reads:
                read = request.success.add().request_range
                read.key, read.range_end = prefix, range_end(prefix)
            try:
                response = await self._txn("multi_set_and_count", request, idempotent=False)
            except Exception as error:
                if not is_retryable(error):
                    raise
                self._conn.failover(self._conn.current, error)
                for index, entry in enumerate(batch):
                    own = next(((k, v) for k, v in entry.puts.items() if k.startswith(head)), None)
                    if counts[index] is None and own is not None:
                        counts[index] = await self._count_at_write(entry, *own, head, end)
                if all(found is not None for found in counts):
                    return [found for found in counts if found is not None]
                if anyio.current_time() > deadline:
                    raise self._conn.unreachable("multi_set_and_count", error) from None
                continue
            ranges = [
                op.response_range
                for op in response.responses
                if op.WhichOneof("response") == "response_range"
            ]
            revision = int(response.header.revision)
            found_reads = {
                prefix: snapshot(self._data, revision, got)
                for prefix, got in zip(reads, ranges[len(ranges) - len(reads) :], strict=True)
            }
            got = iter(int(r.count) for r in ranges[: len(ranges) - len(reads)])
            results = []
            for entry, found in zip(batch, counts, strict=True):
                if found is None:
                    found = next(got)
                    if entry.read is not None:
                        entry.snapshot = found_reads[entry.read]
                results.append(found)
            return results

    async def _count_at_write(
        self, entry: CountedWrite, key: bytes, value: bytes, head: bytes, end: bytes
    ) -> int | None:
        """After a lost reply: the keys in ``[head, end)`` at the revision ``key`` got
        ``value``, and (into ``entry``) the keys under the prefix it reads, at that revision
        (None: it does not hold it, or that history was compacted)."""
        read_key = rpc.TxnRequest(success=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))])
        found = first_kv((await self._txn("read", read_key)).responses[0].response_range)
        if found is None or found.value != value:
            return None
        at = found.mod_revision
        request = rpc.TxnRequest()
        count = request.success.add().request_range
        count.key, count.range_end, count.count_only, count.revision = head, end, True, at
        if entry.read is not None:
            read = request.success.add().request_range
            read.key, read.range_end, read.revision = entry.read, range_end(entry.read), at

        async def attempt(member: Member, timeout: float) -> Any:
            try:
                return await member.kv.Txn(request, timeout=timeout, metadata=member.metadata)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.OUT_OF_RANGE:  # compacted
                    raise
                return None

        response = await self._conn.call("count", attempt)
        if response is None:
            return None
        ranges = [op.response_range for op in response.responses]
        if entry.read is not None:
            entry.snapshot = snapshot(self._data, at, ranges[1])
        return int(ranges[0].count) or None
