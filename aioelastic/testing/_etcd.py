"""Real etcd members on loopback, for tests and benchmarks (ours and users').

:class:`EtcdMember` is one ``etcd`` process (free ports, its own data directory, a log file);
:class:`EtcdCluster` is one or more of them forming a cluster, with the faults a test needs:
``member.kill()`` / ``member.start()`` (a crash and a restart on the same data),
``member.signal(SIGSTOP)`` (a stall), ``cluster.leader()``. Both are synchronous (they are
used from pytest fixtures and benchmark set-up, outside any event loop). Readiness is awaited
with a blocking gRPC read that waits for the member to serve, never with a sleep loop.
Teardown sends SIGTERM to every member at once and SIGKILL to those still running after a
timeout (a leader left alone can take ~7 s to give up leadership).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from aetcd import rpc

BINARY_ENV = "AIOELASTIC_ETCD_BINARY"
HOW_TO_GET_ETCD = (
    "install it (Debian/Ubuntu: apt-get install etcd-server) or set "
    f"{BINARY_ENV} to the path of an etcd binary"
)


def find_etcd_binary() -> str | None:
    """Return the etcd binary from ``$AIOELASTIC_ETCD_BINARY``, then ``PATH``, or None."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("etcd")


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class EtcdMember:
    """One etcd process of a cluster; restartable with the same data directory."""

    def __init__(
        self,
        binary: str,
        name: str,
        base_dir: Path,
        client_port: int,
        peer_port: int,
        initial_cluster: str,
        token: str,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.name = name
        self.data_dir = base_dir / f"{name}.data"
        self.log_path = base_dir / f"{name}.log"
        self.client_port = client_port
        self.peer_port = peer_port
        self.extra_args = list(extra_args)
        self.scheme = "https" if "--cert-file" in self.extra_args else "http"
        self._args = [
            binary,
            "--name", name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", initial_cluster,
            "--initial-cluster-token", token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--pre-vote",  # (3.5 default) a member back from a partition keeps the leader
            "--logger", "zap",
            "--log-outputs", "stderr",
            *self.extra_args,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process (same flags and data directory as before, after a kill)."""
        if self.running:
            raise RuntimeError(f"etcd member {self.name} is already running")
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self._args, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the member's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the process and reap it (a crash, as far as the cluster can tell)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process if it is running."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)


class EtcdCluster:
    """``size`` etcd members on loopback, each on free ports, with data under ``base_dir``.

    ``credentials`` (grpc channel credentials) are what :meth:`wait_ready` connects with when
    ``extra_args`` turn TLS on.
    """

    def __init__(
        self,
        binary: str,
        base_dir: Path,
        size: int = 1,
        *,
        extra_args: Sequence[str] = (),
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        ports = free_ports(2 * size)
        names = [f"m{i + 1}" for i in range(size)]
        initial = ",".join(
            f"{name}=http://127.0.0.1:{ports[2 * i + 1]}" for i, name in enumerate(names)
        )
        token = f"aioelastic-{os.getpid()}-{ports[0]}"
        base_dir.mkdir(parents=True, exist_ok=True)
        self.credentials = credentials
        self.members = [
            EtcdMember(binary, name, base_dir, ports[2 * i], ports[2 * i + 1], initial, token,
                       extra_args)
            for i, name in enumerate(names)
        ]  # fmt: skip

    @property
    def endpoints(self) -> str:
        """``host:port,host:port,...`` of every member."""
        return ",".join(member.endpoint for member in self.members)

    def start(self, timeout: float = 30.0) -> None:
        """Start every member and return once each serves linearizable reads."""
        for member in self.members:
            member.start()
        self.wait_ready(timeout=timeout)

    def _channel(self, member: EtcdMember) -> grpc.Channel:
        if self.credentials is None:
            return grpc.insecure_channel(member.endpoint)
        return grpc.secure_channel(member.endpoint, self.credentials)

    def wait_ready(
        self, members: Sequence[EtcdMember] | None = None, timeout: float = 30.0
    ) -> None:
        """Return once each member (default: every running one) answers a linearizable read.

        Each attempt is a blocking read that waits for the member to accept connections
        and for a leader; between attempts the member's process is checked for an early exit.
        """
        deadline = time.monotonic() + timeout
        for member in members if members is not None else [m for m in self.members if m.running]:
            with self._channel(member) as channel:
                stub = rpc.KVStub(channel)
                while True:
                    if not member.running:
                        raise RuntimeError(
                            f"etcd member {member.name} exited early:\n{member.log_tail()}"
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RuntimeError(
                            f"etcd member {member.name} not ready after {timeout:g} s:\n"
                            f"{member.log_tail()}"
                        )
                    try:
                        stub.Range(
                            rpc.RangeRequest(key=b"health"),
                            timeout=min(remaining, 1.0),
                            wait_for_ready=True,
                        )
                        break
                    except grpc.RpcError:
                        continue

    def leader(self) -> EtcdMember:
        """The member that is the raft leader now."""
        for member in self.members:
            if not member.running:
                continue
            with self._channel(member) as channel:
                status = rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=5)
                if status.leader == status.header.member_id:
                    return member
        raise RuntimeError("no etcd member reports itself as leader")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every running member at once; SIGKILL those still running after timeout."""
        running = [m for m in self.members if m.running]
        for member in running:
            member.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for member in running:
            assert member.process is not None
            try:
                member.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                member.kill()

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
