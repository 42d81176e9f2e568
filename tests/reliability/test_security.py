"""Security: who can reach the FIFO, what a token protects, what the logs keep to themselves."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aioelastic.store import StoreRefusedError, TCPStore, TCPStoreServer
from aioelastic.store._tcp_codec import (
    FrameReader,
    Op,
    Status,
    decode_reply,
    encode_preamble,
    encode_request,
)
from aioelastic.timer import FileTimerServer, TimerConfigError

pytestmark = pytest.mark.anyio

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as another user (needs root)")
NOBODY = 65534
TOKEN = "s3cr3t-T0KEN-never-logged"
WRONG_TOKEN = "wr0ng-T0KEN-never-logged-either"


def write_as_nobody(path: str) -> subprocess.CompletedProcess[bytes]:
    """Try, as user nobody, to open ``path`` for writing without blocking."""
    script = 'exec 3<>"$1" && echo opened'
    return subprocess.run(
        ["/bin/sh", "-c", script, "sh", path], user="nobody", capture_output=True, check=False
    )


# -- the FIFO ------------------------------------------------------------------------------


async def test_private_fifo_and_directory_are_the_owners_only() -> None:
    """With no path the FIFO is 0600 in a 0700 directory, both owned by the server's user."""
    async with FileTimerServer(None) as server:
        fifo = os.lstat(server.file_path)
        directory = os.lstat(os.path.dirname(server.file_path))
    assert stat.S_ISFIFO(fifo.st_mode)
    assert (stat.S_IMODE(fifo.st_mode), stat.S_IMODE(directory.st_mode)) == (0o600, 0o700)
    assert fifo.st_uid == directory.st_uid == os.geteuid()


async def test_fifo_mode_ignores_a_permissive_umask(tmp_path: Path) -> None:
    """A umask of 0 does not widen the FIFO beyond 0600."""
    old = os.umask(0)
    try:
        async with FileTimerServer(tmp_path / "t.fifo") as server:
            mode = stat.S_IMODE(os.lstat(server.file_path).st_mode)
    finally:
        os.umask(old)
    assert mode == 0o600


@pytest.fixture
def sticky_dir() -> Iterator[Path]:
    """A 1777 directory in /tmp, so that only the FIFO's own mode can stop another user."""
    path = Path(tempfile.mkdtemp(prefix="aioelastic-sticky-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("private", [True, False], ids=["private-dir", "sticky-dir"])
async def test_other_users_cannot_open_the_fifo(sticky_dir: Path, private: bool) -> None:
    """User nobody cannot open the FIFO for writing (private directory, or a sticky 1777 one)."""
    path = None if private else sticky_dir / "t.fifo"
    async with FileTimerServer(path) as server:
        attempt = write_as_nobody(server.file_path)
        os.chmod(server.file_path, 0o666)
        control = write_as_nobody(server.file_path)
    assert attempt.returncode != 0
    assert b"opened" not in attempt.stdout
    assert b"ermission denied" in attempt.stderr
    # The control shows the probe works: the server's mode, not the probe, stopped nobody.
    assert control.stdout == (b"" if private else b"opened\n")


@pytest.mark.parametrize("target", ["fifo", "file", "dangling"])
async def test_symlink_at_the_path_is_refused(tmp_path: Path, target: str) -> None:
    """A symlink at the FIFO path (to a FIFO, a file or nowhere) is refused and left alone."""
    pointee = tmp_path / "pointee"
    if target == "fifo":
        os.mkfifo(pointee, 0o600)
    elif target == "file":
        pointee.write_bytes(b"keep")
    link = tmp_path / "t.fifo"
    link.symlink_to(pointee)
    with pytest.raises(TimerConfigError, match="exists and is not a FIFO"):
        async with FileTimerServer(link):
            pass
    assert link.is_symlink()
    assert os.readlink(link) == str(pointee)


async def test_regular_file_at_the_path_is_refused_and_kept(tmp_path: Path) -> None:
    """A regular file at the FIFO path is refused and its content left intact."""
    path = tmp_path / "t.fifo"
    path.write_bytes(b"precious")
    with pytest.raises(TimerConfigError, match="not a FIFO"):
        async with FileTimerServer(path):
            pass
    assert path.read_bytes() == b"precious"


@needs_root
async def test_someone_elses_fifo_is_refused_not_reused(tmp_path: Path) -> None:
    """A FIFO at the path owned by another user is refused; it stays where it was."""
    path = tmp_path / "t.fifo"
    os.mkfifo(path, 0o666)
    os.chown(path, NOBODY, NOBODY)
    before = os.lstat(path)
    with pytest.raises(TimerConfigError, match="owned by uid 65534"):
        async with FileTimerServer(path):
            pass
    after = os.lstat(path)
    assert (after.st_ino, after.st_uid) == (before.st_ino, NOBODY)


async def test_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    """A FIFO path in a directory others may write to (no sticky bit) is refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(TimerConfigError, match="writable by other users"):
        async with FileTimerServer(shared / "t.fifo"):
            pass
    assert list(shared.iterdir()) == []


# -- the TCP store's token ---------------------------------------------------------------


def raw_exchange(port: int, *frames: bytes) -> list[tuple[Status, tuple[object, ...]]]:
    """Send a preamble and ``frames`` on a raw socket; return the replies until the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_preamble() + b"".join(frames))
        reader, replies = FrameReader(), []
        while data := sock.recv(65536):
            replies += [decode_reply(body) for body in reader.feed(data)]
    return [(reply.status, reply.fields) for reply in replies]


@pytest.mark.parametrize(
    ("hello", "statuses"),
    [
        ([], [Status.REFUSED]),
        ([encode_request(Op.HELLO, 1, b"")], [Status.REFUSED]),
        ([encode_request(Op.HELLO, 1, TOKEN.encode())], [Status.REFUSED]),
        (
            [encode_request(Op.HELLO, 1, bytes(32)), encode_request(Op.AUTH, 1, bytes(32))],
            [Status.CHALLENGE, Status.REFUSED],
        ),
    ],
    ids=["no-hello", "no-token", "token-in-hello", "forged-proof"],
)
async def test_unauthenticated_client_reaches_no_key(
    hello: list[bytes], statuses: list[Status]
) -> None:
    """Without a proof of the token a client is refused before any read or write takes effect."""
    async with TCPStoreServer(token=TOKEN) as server:
        await server.store.set("secret", b"value")
        frames = [
            *hello,
            encode_request(Op.SET, 2, "planted", b"x", None),
            encode_request(Op.GET, 3, "secret", 1.0),
            encode_request(Op.DELETE_KEY, 4, "secret"),
        ]
        replies = await anyio.to_thread.run_sync(raw_exchange, server.port, *frames)
        assert [status for status, _ in replies] == statuses
        assert await server.store.check(["planted"]) is False
        assert await server.store.get("secret") == b"value"
        assert server.statistics().refused_connections == 1


async def test_wrong_token_client_gets_a_refusal() -> None:
    """A TCPStore with the wrong token fails to open with StoreRefusedError."""
    async with TCPStoreServer(token=TOKEN) as server:
        with pytest.raises(StoreRefusedError, match="token"):
            async with TCPStore("127.0.0.1", server.port, token=WRONG_TOKEN, connect_timeout=5):
                pass


async def test_tokens_never_reach_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Neither the server's token nor a wrong one appears in any log record or error."""
    caplog.set_level(logging.DEBUG)
    async with TCPStoreServer(token=TOKEN) as server:
        async with TCPStore("127.0.0.1", server.port, token=TOKEN) as store:
            await store.set("k", b"v")
        with pytest.raises(StoreRefusedError) as refused:
            async with TCPStore("127.0.0.1", server.port, token=WRONG_TOKEN, connect_timeout=5):
                pass
    text = "\n".join(r.getMessage() for r in caplog.records) + str(refused.value)
    assert "refused" in text
    assert TOKEN not in text
    assert WRONG_TOKEN not in text


async def test_no_token_server_binds_loopback_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without a token the server listens on 127.0.0.1 by default and logs that address."""
    caplog.set_level(logging.INFO)
    async with TCPStoreServer() as server:
        assert server.host == "127.0.0.1"
    assert any("127.0.0.1" in r.getMessage() for r in caplog.records)


async def test_no_token_on_a_public_address_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    """Without a token on a non-loopback address the server warns that anyone may connect."""
    caplog.set_level(logging.INFO)
    async with TCPStoreServer("0.0.0.0"):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no token" in w for w in warnings)


def test_store_server_cli_keeps_the_token_out_of_its_output(tmp_path: Path) -> None:
    """`aioelastic store-server --token-file` prints neither the token nor the file content."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    command = [sys.executable, "-m", "aioelastic", "store-server", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--token-file", str(token_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert b"listening on 127.0.0.1:" in ready
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert TOKEN.encode() not in ready + out + err
