"""A c10d endpoint is local by this host's interface address or --local-addr (hosts that
share one host name, as network namespaces do, are told apart by address)."""

from __future__ import annotations

import json
import sys

import pytest

from aioelastic.testing import Network

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

CHECK = """
import anyio, json, sys
from aioelastic.rendezvous._local import endpoint_is_local, interface_addresses
host, local_addr = sys.argv[1], sys.argv[2] or None
print(json.dumps([anyio.run(endpoint_is_local, host, local_addr), sorted(interface_addresses())]))
"""


@pytest.mark.parametrize(
    ("target", "local_addr", "expected"),
    [("own", "", True), ("other", "", False), ("other", "other", True), ("loopback", "", True)],
)
async def test_an_endpoint_is_local_by_address(
    target: str, local_addr: str, expected: bool
) -> None:
    """Inside host 0: its own address and loopback are local, host 1's is not unless it is
    the --local-addr given."""
    async with Network(2) as net:
        own, other = net.hosts
        names = {"own": own.addr, "other": other.addr, "loopback": "127.0.0.1", "": ""}
        done = await own.run([sys.executable, "-c", CHECK, names[target], names[local_addr]])
        local, addresses = json.loads(done.stdout)
    assert local is expected
    assert own.addr in addresses
    assert other.addr not in addresses
