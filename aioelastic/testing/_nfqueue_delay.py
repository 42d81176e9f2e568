"""Delay every packet of one NFQUEUE queue by a fixed time: latency where ``tc netem`` is missing.

Run inside a host's namespace as ``python -m aioelastic.testing._nfqueue_delay QUEUE MS``,
next to an iptables rule sending the host's outgoing packets to ``QUEUE``. It speaks the
kernel's nfnetlink queue protocol directly (a raw netlink socket, no library): bind the queue
asking for metadata only, then accept each packet ``MS`` milliseconds after it arrived, in
order. It prints ``ready`` once bound, and runs until killed.
"""

from __future__ import annotations

import collections
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_ACCEPT = 1


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def message(kind: int, queue: int, attrs: bytes, *, family: int = 0, seq: int = 0) -> bytes:
    """One nfnetlink queue message (netlink header, nfgenmsg, attributes)."""
    body = struct.pack("!BBH", family, 0, queue) + attrs
    header = struct.pack(
        "=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, NLM_F_REQUEST | NLM_F_ACK, seq, 0
    )
    return header + body


def bind_messages(queue: int) -> list[bytes]:
    """Bind ``queue`` for IPv4 and ask for packet metadata only."""
    bind = _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET))
    params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
    return [
        message(NFQNL_MSG_CONFIG, queue, bind, family=socket.AF_INET, seq=1),
        message(NFQNL_MSG_CONFIG, queue, params, family=socket.AF_INET, seq=2),
    ]


def verdict(queue: int, packet_id: int) -> bytes:
    """Accept packet ``packet_id``."""
    attr = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
    header_free = message(NFQNL_MSG_VERDICT, queue, attr)
    # Verdicts need no ack: clear NLM_F_ACK so the kernel sends nothing back.
    return header_free[:6] + struct.pack("=H", NLM_F_REQUEST) + header_free[8:]


def packet_ids(data: bytes) -> tuple[list[int], list[int]]:
    """The ids of the queued packets in ``data`` and the error codes of acks in it."""
    ids, errors, offset = [], [], 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            break
        if kind == NLMSG_ERROR:
            errors.append(struct.unpack_from("=i", data, offset + 16)[0])
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at = offset + 20
            while at + 4 <= offset + length:
                size, attr = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if attr & 0x3FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + 4)[0])
                at += size + (-size % 4)
        offset += length + (-length % 4)
    return ids, errors


def main(argv: list[str]) -> int:
    queue, delay = int(argv[0]), float(argv[1]) / 1000
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((0, 0))
    for request in bind_messages(queue):
        sock.send(request)
        _, errors = packet_ids(sock.recv(65536))
        if any(errors):
            print(f"binding queue {queue} failed: errno {-errors[0]}", file=sys.stderr)
            return 1
    print("ready", flush=True)
    pending: collections.deque[tuple[float, int]] = collections.deque()
    while True:
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else None
        readable, _, _ = select.select([sock], [], [], timeout)
        if readable:
            ids, _ = packet_ids(sock.recv(1 << 16))
            due = time.monotonic() + delay
            pending.extend((due, packet_id) for packet_id in ids)
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            sock.send(verdict(queue, pending.popleft()[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
