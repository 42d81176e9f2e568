"""Whether a rendezvous endpoint names this host: by address, by ``--local-addr``, or by name.

Hosts that share a name (containers, network namespaces) are told apart by their interface
addresses, so an endpoint given as an address is local exactly when one of this host's
interfaces carries it. On Linux the addresses come from one netlink dump (``RTM_GETADDR``):
a local syscall that answers at once, so it runs on the event loop. A name is resolved with
:func:`anyio.getaddrinfo` (a worker thread), never with a blocking lookup on the loop.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
import sys

import anyio

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

_NETLINK_ROUTE = 0
_RTM_NEWADDR, _RTM_GETADDR = 20, 22
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def parse_addresses(data: bytes) -> tuple[set[str], bool]:
    """The addresses in a chunk of an ``RTM_GETADDR`` dump, and whether the dump ended."""
    found: set[str] = set()
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return found, True
        if kind in (_NLMSG_DONE, _NLMSG_ERROR):
            return found, True
        if kind == _RTM_NEWADDR and length >= 24:
            family = data[offset + 16]
            at, end = offset + 24, offset + length
            while at + 4 <= end:
                size, attr = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if attr in (_IFA_ADDRESS, _IFA_LOCAL) and family in (
                    socket.AF_INET,
                    socket.AF_INET6,
                ):
                    found.add(socket.inet_ntop(family, data[at + 4 : at + size]))
                at += (size + 3) & ~3
        offset += (length + 3) & ~3
    return found, False


def interface_addresses() -> frozenset[str]:
    """Every IPv4 and IPv6 address on this host's interfaces (empty where netlink is missing)."""
    if not sys.platform.startswith("linux"):
        return frozenset()
    request = struct.pack("=IHHII", 16 + 8, _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
    request += struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0)
    found: set[str] = set()
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE) as sock:
            sock.bind((0, 0))
            sock.send(request)
            done = False
            while not done:
                chunk, done = parse_addresses(sock.recv(1 << 16))
                found |= chunk
    except OSError:
        return frozenset()
    return frozenset(found)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def endpoint_is_local(host: str, local_addr: str | None = None) -> bool:
    """Whether ``host`` (an endpoint's host part) is this host.

    True for a loopback address or name, for ``local_addr`` (``--local-addr``), for an
    address on one of this host's interfaces, for this host's name, and for a name that
    resolves to one of those addresses.
    """
    host = host.strip("[]")
    if host in _LOOPBACK_NAMES or _is_loopback(host):
        return True
    if local_addr is not None and host == local_addr.strip("[]"):
        return True
    mine = interface_addresses()
    if _is_address(host):
        return host in mine
    if host == socket.gethostname():
        return True
    try:
        infos = await anyio.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    resolved = {str(info[4][0]) for info in infos}
    return any(address in mine or _is_loopback(address) for address in resolved)


@functools.cache
def local_hostname() -> str:
    """This host's fully qualified name (computed once: it may need DNS)."""
    return socket.getfqdn(socket.gethostname())


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` now (for the workers' own store on rank 0)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    bind_addr = addr if addr in ("127.0.0.1", "::1") else ""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((bind_addr, 0))
        return int(sock.getsockname()[1])
