"""Hosts as Linux network namespaces on a private bridge, with real network faults.

```python
async with Network(3) as net:              # hosts 198.18.0.1 .. 198.18.0.3
    agent = await net.hosts[0].start(["aioelastic", "run", ...])
    await net.cut(net.hosts[2])            # silent: packets are dropped, nothing is reset
    await net.heal()
```

Theory of operation. A network is one *switch* namespace holding a bridge and one namespace
per host, each joined to the bridge by a veth pair created directly inside the two namespaces:
no interface of the pair ever exists in the machine's own namespace, the hosts' only route is
their subnet on ``eth0``, so their traffic never reaches the machine's interfaces. Names
carry the pid and a counter, so several test runs on one machine never collide.

Faults are nftables rules in the switch namespace (a ``bridge`` table on the forward hook), so
the processes on the hosts cannot see or undo them, and each change rewrites the whole table
atomically: a host cut from all, one direction between two hosts, a partition between two
groups, packet loss. ARP is left alone, so a cut looks like a silent firewall, not a pulled
cable: connections hang and retransmit, as in a real partition. Latency delays the packets a
host sends: ``tc netem`` where the kernel has it, else an NFQUEUE delayer run in the host.

Clean-up removes every process left in the hosts and every namespace (the veths go with
them) when the ``with`` block ends, fails or is cancelled. A *janitor* (``sh``, in its own
session) holds a pipe from this process and does the same if this process dies without
cleaning up (SIGKILL included); at start, namespaces left by runs whose process is gone are
swept.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

PREFIX = "aioe-"
"""Every namespace this module makes is named ``aioe-<pid>-<counter>-<role>``."""

DEFAULT_SUBNET = "198.18.0.0/24"
"""Addresses of the benchmarking range (RFC 2544): routed nowhere, and only inside the hosts."""

_TABLE = "aioelastic_faults"
_LINK_TIMEOUT = 10.0
_counter = itertools.count()

_JANITOR = r"""
cat >/dev/null
for ns in "$@"; do
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
done
exit 0
"""


class NetworkUnavailableError(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``/``nft``, no kernel support)."""


class FaultUnsupportedError(RuntimeError):
    """The kernel or the installed tools cannot inject this fault."""


@dataclass(frozen=True)
class Command:
    """One program to run: its argv and what to feed on its standard input."""

    argv: tuple[str, ...]
    stdin: bytes = b""
    check: bool = True


@functools.cache
def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None if they can (checked once, by trying)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"no `{tool}` command: install {package} (apt-get install -y {package})"
    name = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    return None


@dataclass(frozen=True)
class Host:
    """One host of a :class:`Network`: a namespace with one address on the bridge."""

    index: int
    netns: str
    addr: str
    link: str
    """The name of the host's veth end in the switch namespace."""

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host (its network only: files and pids are shared)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host (synchronously; ``options`` go to ``Popen``)."""
        return subprocess.Popen(self.command(argv), **options)

    async def start(self, argv: Sequence[str], **options: Any) -> anyio.abc.Process:
        """Start ``argv`` on this host (``options`` go to :func:`anyio.open_process`)."""
        return await anyio.open_process(self.command(argv), **options)

    async def run(
        self, argv: Sequence[str], *, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` on this host to completion and return its outcome."""
        return await anyio.run_process(self.command(argv), check=check)


def _host_rules(host: Host) -> list[str]:
    return [f"ip saddr {host.addr} drop", f"ip daddr {host.addr} drop"]


def _between(sources: Iterable[Host], targets: Iterable[Host]) -> list[str]:
    targets = list(targets)
    return [f"ip saddr {a.addr} ip daddr {b.addr} drop" for a in sources for b in targets]


class Network:
    """``hosts`` network namespaces on one private bridge; see the module docstring.

    Use as ``async with``: set-up, faults and clean-up run ``ip``/``nft`` as subprocesses
    awaited on the loop. Raises :class:`NetworkUnavailableError` on entry where
    namespaces cannot be made (:func:`unavailable_reason` says why without trying to enter).
    """

    def __init__(self, hosts: int, *, subnet: str = DEFAULT_SUBNET) -> None:
        network = ipaddress.ip_network(subnet)
        if not isinstance(network, ipaddress.IPv4Network):
            raise ValueError(f"subnet {subnet!r} must be IPv4")
        if not 1 <= hosts < network.num_addresses - 2:
            raise ValueError(f"{hosts} hosts do not fit in {subnet}")
        self.name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.name}-sw"
        self.prefixlen = network.prefixlen
        addresses = itertools.islice(network.hosts(), hosts)
        self.hosts = [
            Host(i, f"{self.name}-h{i}", str(addr), f"v{i}") for i, addr in enumerate(addresses)
        ]
        self._rules: list[str] = []
        self._delayed: dict[int, str] = {}  # host index -> "netem" or "nfqueue"
        self._delayers: list[anyio.abc.Process] = []
        self._janitor: anyio.abc.Process | None = None
        self._entered = False

    def __repr__(self) -> str:
        return f"Network({self.name!r}, hosts={[h.addr for h in self.hosts]})"

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of this network (hosts, then the switch)."""
        return [host.netns for host in self.hosts] + [self.switch]

    def host(self, addr: str) -> Host:
        """The host with address ``addr``."""
        for host in self.hosts:
            if host.addr == addr:
                return host
        raise KeyError(f"no host has address {addr!r} in {self!r}")

    # -- the commands (pure: lists of programs to run) -------------------------------------------

    def _setup_commands(self) -> list[Command]:
        sw = self.switch
        commands = [Command(("ip", "netns", "add", name)) for name in self.namespaces]
        switch_batch = [
            "link add br0 type bridge forward_delay 0",
            "link set br0 up",
            "link set lo up",
        ]
        for host in self.hosts:
            commands.append(
                Command(
                    ("ip", "-n", sw, "link", "add", host.link, "type", "veth",
                     "peer", "name", "eth0", "netns", host.netns)
                )
            )  # fmt: skip
            switch_batch += [f"link set {host.link} master br0", f"link set {host.link} up"]
            host_batch = [
                f"addr add {host.addr}/{self.prefixlen} dev eth0",
                "link set eth0 up",
                "link set lo up",
            ]
            commands.append(Command(("ip", "-n", host.netns, "-b", "-"), _lines(host_batch)))
        commands.append(Command(("ip", "-n", sw, "-b", "-"), _lines(switch_batch)))
        commands.append(self._ruleset_command())
        return commands

    def _ruleset_command(self) -> Command:
        rules = "\n".join(f"    {rule}" for rule in self._rules)
        text = (
            f"table bridge {_TABLE}\ndelete table bridge {_TABLE}\n"
            f"table bridge {_TABLE} {{\n  chain forward {{\n"
            "    type filter hook forward priority 0; policy accept;\n"
            f"{rules}\n  }}\n}}\n"
        )
        return Command(("ip", "netns", "exec", self.switch, "nft", "-f", "-"), text.encode())

    def _teardown_commands(self) -> list[Command]:
        return [Command(("ip", "netns", "del", name), check=False) for name in self.namespaces]

    # -- running them ------------------------------------------------------------------------

    async def _run(self, commands: Iterable[Command]) -> None:
        for command in commands:
            done = await anyio.run_process(command.argv, input=command.stdin, check=False)
            if command.check and done.returncode != 0:
                raise _failed(command, done.stderr)

    # -- lifecycle -------------------------------------------------------------------------------

    async def _begin(self) -> None:
        if self._entered:
            raise RuntimeError(f"{self!r} was already entered; make a new Network")
        reason = unavailable_reason()
        if reason is not None:
            raise NetworkUnavailableError(reason)
        self._entered = True
        sweep_stale()
        self._janitor = await anyio.open_process(
            ["sh", "-c", _JANITOR, "janitor", *self.namespaces],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a ^C to the test's process group must not stop it first
        )

    async def __aenter__(self) -> Self:
        await self._begin()
        try:
            await self._run(self._setup_commands())
            with anyio.fail_after(_LINK_TIMEOUT):
                await self._wait_links_up()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()

    async def _wait_links_up(self) -> None:
        """Return once every host's port on the bridge forwards (a veth's carrier comes up
        asynchronously, up to a second later: a packet sent before then is lost)."""
        monitor = await anyio.open_process(
            ["ip", "-n", self.switch, "-o", "monitor", "link"], stderr=subprocess.DEVNULL
        )
        try:
            assert monitor.stdout is not None
            while True:
                listed = await anyio.run_process(["bridge", "-n", self.switch, "link"])
                if listed.stdout.decode().count("state forwarding") == len(self.hosts):
                    return
                await monitor.stdout.receive()  # a link changed: look again
        finally:
            monitor.kill()
            await monitor.aclose()

    async def aclose(self) -> None:
        """Kill every process left on the hosts, remove every namespace (idempotent)."""
        for host in self.hosts:
            done = await anyio.run_process(["ip", "netns", "pids", host.netns], check=False)
            _kill(done.stdout)
        await self._stop_delayers()
        await self._run(self._teardown_commands())
        await self._dismiss_janitor()

    async def _dismiss_janitor(self) -> None:
        janitor, self._janitor = self._janitor, None
        if janitor is not None:
            assert janitor.stdin is not None
            await janitor.stdin.aclose()  # it runs the (now empty) clean-up and exits
            await janitor.wait()

    # -- faults -----------------------------------------------------------------------------

    async def cut(self, host: Host) -> None:
        """Cut ``host`` from every other host, both ways (silently: nothing is reset)."""
        await self._apply(_host_rules(host))

    async def cut_one_way(self, source: Host, target: Host) -> None:
        """Drop what ``source`` sends to ``target``; ``target`` still reaches ``source``."""
        await self._apply(_between([source], [target]))

    async def partition(self, side: Sequence[Host], other: Sequence[Host] | None = None) -> None:
        """Cut ``side`` from ``other`` (default: every other host), both ways; each side
        keeps its own links (an etcd minority cut from the majority, say)."""
        rest = [h for h in self.hosts if h not in side] if other is None else list(other)
        await self._apply(_between(side, rest) + _between(rest, side))

    async def lose(self, host: Host, percent: float) -> None:
        """Drop ``percent`` of the packets ``host`` sends and of those sent to it, at random."""
        if not 0 < percent <= 100:
            raise ValueError(f"loss of {percent}% must be in (0, 100]")
        per_mille = round(percent * 10)
        await self._apply(
            [
                f"ip saddr {host.addr} numgen random mod 1000 < {per_mille} drop",
                f"ip daddr {host.addr} numgen random mod 1000 < {per_mille} drop",
            ]
        )

    async def delay(self, host: Host, milliseconds: float) -> None:
        """Delay every packet ``host`` sends by ``milliseconds`` (``tc netem`` where the
        kernel has it, else an NFQUEUE delayer in the host; :class:`FaultUnsupportedError`
        when neither can be used)."""
        if not 0 < milliseconds <= 60_000:
            raise ValueError(f"a delay of {milliseconds} ms must be in (0, 60000]")
        if host.index in self._delayed:
            raise FaultUnsupportedError(f"host {host.addr} is already delayed; heal() first")
        netem = ("tc", "-n", host.netns, "qdisc", "add", "dev", "eth0", "root", "netem",
                 "delay", f"{milliseconds}ms")  # fmt: skip
        if (await anyio.run_process(netem, check=False)).returncode == 0:
            self._delayed[host.index] = "netem"
            return
        if shutil.which("iptables") is None:
            raise FaultUnsupportedError(
                "latency needs tc netem (CONFIG_NET_SCH_NETEM) or iptables' NFQUEUE target "
                "(apt-get install -y iptables); this machine has neither"
            )
        delayer = await host.start(
            [sys.executable, "-m", "aioelastic.testing._nfqueue_delay", "0", str(milliseconds)],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self._delayers.append(delayer)
        assert delayer.stdout is not None
        first = await BufferedByteReceiveStream(delayer.stdout).receive_until(b"\n", 4096)
        if first != b"ready":
            raise FaultUnsupportedError(f"the NFQUEUE delayer did not start: {first.decode()!r}")
        await host.run(
            ["iptables", "-A", "OUTPUT", "-o", "eth0", "-j", "NFQUEUE", "--queue-num", "0",
             "--queue-bypass"]
        )  # fmt: skip
        self._delayed[host.index] = "nfqueue"

    async def heal(self) -> None:
        """Remove every fault: all hosts reach each other again at full speed."""
        self._rules = []
        for index, kind in sorted(self._delayed.items()):
            host = self.hosts[index]
            if kind == "netem":
                await host.run(["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            else:
                await host.run(["iptables", "-F", "OUTPUT"], check=False)
        self._delayed.clear()
        await self._stop_delayers()
        await self._run([self._ruleset_command()])

    def faults(self) -> list[str]:
        """The nftables rules in force now (for messages and reports)."""
        return list(self._rules)

    async def _apply(self, rules: list[str]) -> None:
        self._rules += rules
        await self._run([self._ruleset_command()])

    async def _stop_delayers(self) -> None:
        delayers, self._delayers = self._delayers, []
        for delayer in delayers:
            with contextlib.suppress(ProcessLookupError):
                delayer.kill()
            await delayer.aclose()


def _lines(lines: Iterable[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


def _failed(command: Command, stderr: bytes | str | None) -> RuntimeError:
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else (stderr or "")
    return RuntimeError(f"`{' '.join(command.argv)}` failed: {text.strip()}")


def _kill(pids_output: bytes | str | None) -> None:
    text = pids_output.decode() if isinstance(pids_output, bytes) else (pids_output or "")
    for word in text.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGKILL)


def sweep_stale() -> list[str]:
    """Remove namespaces this module made in processes that no longer exist; return their
    names (a run killed together with its janitor leaves them behind)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        if not name.startswith(PREFIX):
            continue
        pid_text = name[len(PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True).stdout
        _kill(pids)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
