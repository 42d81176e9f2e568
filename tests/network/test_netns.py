"""The multi-host harness: hosts in namespaces on a private bridge, real faults, full clean-up."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from aioelastic.testing import Host, Network

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("netns")]

PROBE = str(Path(__file__).with_name("probe.py"))
PORT = 7000


def names_in(listing: bytes) -> set[str]:
    return {line.split(" ", 1)[0] for line in listing.decode().splitlines()}


def listed_now() -> set[str]:
    return names_in(subprocess.run(["ip", "netns", "list"], capture_output=True).stdout)


async def namespaces() -> set[str]:
    return names_in((await anyio.run_process(["ip", "netns", "list"])).stdout)


async def machine_links() -> list[str]:
    """The names of the interfaces in the machine's own namespace."""
    listed = (await anyio.run_process(["ip", "-o", "link"])).stdout.decode()
    return [line.split(":")[1] for line in listed.splitlines()]


async def probe(host: Host, *args: str) -> str:
    done = await host.run([sys.executable, PROBE, *args])
    return done.stdout.decode().strip()


def lines(process: anyio.abc.Process) -> BufferedByteReceiveStream:
    assert process.stdout is not None
    return BufferedByteReceiveStream(process.stdout)


async def ready(process: anyio.abc.Process) -> BufferedByteReceiveStream:
    output = lines(process)
    assert await output.receive_until(b"\n", 100) == b"ready"
    return output


async def connect(source: Host, target: Host) -> str:
    """ok, refused or timeout: a TCP round trip from ``source`` to ``target``'s server."""
    return (await probe(source, "connect", target.addr, str(PORT), "1")).split()[0]


@pytest.fixture
async def net() -> AsyncIterator[Network]:
    """Three hosts, each serving an echo server on PORT."""
    async with Network(3) as network:
        servers = [await h.start([sys.executable, PROBE, "serve", h.addr, str(PORT)])
                   for h in network.hosts]  # fmt: skip
        for server in servers:
            await ready(server)
        yield network
        for server in servers:
            server.kill()
            await server.aclose()


async def test_hosts_reach_each_other_by_address(net: Network) -> None:
    """Every host reaches every other one on the bridge."""
    a, b, c = net.hosts
    assert [await connect(a, b), await connect(b, c), await connect(c, a)] == ["ok"] * 3


async def test_hosts_route_only_their_own_subnet(net: Network) -> None:
    """A host's only route is its /24 on eth0: nothing can leave the namespaces."""
    done = await net.hosts[0].run(["ip", "-o", "-4", "route"])
    routes = done.stdout.decode().strip().splitlines()
    assert [route.split()[0] for route in routes] == ["198.18.0.0/24"]


async def test_a_cut_host_reaches_no_one_and_the_others_still_meet(net: Network) -> None:
    """After cut(c), c times out both ways (no reset), a and b still talk; heal undoes it."""
    a, b, c = net.hosts
    await net.cut(c)
    assert [
        await connect(a, c),
        await connect(c, b),
        await connect(a, b),
    ] == ["timeout", "timeout", "ok"]
    await net.heal()
    assert [await connect(a, c), await connect(c, b)] == ["ok", "ok"]


async def test_a_partition_keeps_each_side_connected(net: Network) -> None:
    """partition([a]) cuts a from b and c, while b and c still talk."""
    a, b, c = net.hosts
    await net.partition([a])
    assert [
        await connect(a, b),
        await connect(c, a),
        await connect(b, c),
    ] == ["timeout", "timeout", "ok"]


async def datagrams(net: Network, source: Host, target: Host, count: int) -> int:
    """How many of ``count`` datagrams from ``source`` reach ``target``."""
    receiver = await target.start([sys.executable, PROBE, "receive", str(PORT + 1), "1"])
    output = await ready(receiver)
    await probe(source, "send", target.addr, str(PORT + 1), str(count))
    received = int(await output.receive_until(b"\n", 100))
    await receiver.aclose()
    return received


async def test_a_one_way_cut_drops_one_direction_only(net: Network) -> None:
    """cut_one_way(a, b): nothing from a reaches b, everything from b reaches a."""
    a, b, _ = net.hosts
    await net.cut_one_way(a, b)
    assert (await datagrams(net, a, b, 20), await datagrams(net, b, a, 20)) == (0, 20)


async def test_loss_drops_some_packets_not_all(net: Network) -> None:
    """lose(b, 50) lets some but not all of 300 datagrams through."""
    a, b, _ = net.hosts
    await net.lose(b, 50)
    assert 0 < await datagrams(net, a, b, 300) < 300


async def test_delay_slows_every_round_trip(net: Network) -> None:
    """delay(b, 300) makes a TCP round trip with b take at least 300 ms; heal restores it."""
    a, b, _ = net.hosts
    await net.delay(b, 300)
    reply = await probe(a, "connect", b.addr, str(PORT), "5")
    assert reply.startswith("ok")
    assert float(reply.split()[1]) >= 0.3
    await net.heal()
    assert await connect(a, b) == "ok"


async def test_leaving_removes_every_namespace_and_process() -> None:
    """After the block, the namespaces are gone and a process left on a host is dead."""
    async with Network(2) as network:
        names = set(network.namespaces)
        assert names <= await namespaces()
        sleeper = await network.hosts[1].start(["sleep", "600"])
    assert not names & await namespaces()
    assert await sleeper.wait() == -signal.SIGKILL
    await sleeper.aclose()


async def test_a_failing_block_still_cleans_up() -> None:
    """An exception inside the block removes the namespaces too."""
    names: set[str] = set()

    async def fail_inside() -> None:
        async with Network(2) as network:
            names.update(network.namespaces)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        await fail_inside()
    assert names
    assert not names & await namespaces()


async def test_no_interface_appears_in_the_machine_namespace() -> None:
    """Every link is made inside the namespaces: the machine's own interfaces are untouched."""
    before = await machine_links()
    async with Network(2) as network:
        assert set(network.namespaces) <= await namespaces()
        assert await machine_links() == before


KILLED_OWNER = """
import anyio
from aioelastic.testing import Network

async def main():
    async with Network(2) as network:
        print(" ".join(network.namespaces), network._janitor.pid, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


def test_a_killed_owner_leaves_nothing_behind() -> None:
    """SIGKILL of the process that made a network: its janitor removes the namespaces."""
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER], stdout=subprocess.PIPE, text=True
    ) as owner:
        assert owner.stdout is not None
        *names, janitor = owner.stdout.readline().split()
        assert set(names) <= listed_now()
        watch = os.pidfd_open(int(janitor))
        owner.kill()
    assert select.select([watch], [], [], 30)[0] == [watch], "the janitor did not finish"
    os.close(watch)
    assert not set(names) & listed_now()
