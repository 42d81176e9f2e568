"""``aioelastic store-server`` as a real subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from aioelastic.store import StoreRefusedError, TCPStore

pytestmark = pytest.mark.anyio

SERVER = [sys.executable, "-m", "aioelastic", "store-server"]


async def test_server_subprocess_serves_clients_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The CLI prints its port, serves token-holding clients, refuses others, exits 0 on SIGTERM."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    command = [*SERVER, "--port", "0", "--token-file", str(token_file)]
    async with await anyio.open_process(command, stderr=subprocess.DEVNULL) as process:
        assert process.stdout is not None
        with anyio.fail_after(30):  # generous: a cold interpreter start on a busy machine
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 200)
        match = re.fullmatch(
            r"aioelastic store server listening on 127\.0\.0\.1:(\d+)", line.decode()
        )
        assert match is not None, line
        port = int(match[1])
        async with TCPStore("127.0.0.1", port, token="s3cret") as store:
            await store.set("k", b"v")
            assert await store.get("k") == b"v"
        with pytest.raises(StoreRefusedError, match="token does not match"):
            async with TCPStore("127.0.0.1", port, token="guess"):
                pass
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


async def test_empty_token_file_is_refused_with_exit_status_2(tmp_path: Path) -> None:
    """An empty token file is a configuration error that names the file."""
    token_file = tmp_path / "token"
    token_file.write_text("  \n")
    result = await anyio.run_process([*SERVER, "--token-file", str(token_file)], check=False)
    assert result.returncode == 2
    assert f"the token file '{token_file}' is empty" in result.stderr.decode()


async def test_missing_token_file_is_refused(tmp_path: Path) -> None:
    """A token file that cannot be read is named, with the reason."""
    missing = tmp_path / "nope"
    result = await anyio.run_process([*SERVER, "--token-file", str(missing)], check=False)
    assert result.returncode == 2
    assert f"cannot read the token file '{missing}': No such file or directory" in (
        result.stderr.decode()
    )


async def test_require_auth_without_a_token_on_a_public_address_exits_2() -> None:
    """`--require-auth` makes a tokenless server on a non-loopback address refuse to start."""
    command = [*SERVER, "--host", "0.0.0.0", "--port", "0", "--require-auth"]
    result = await anyio.run_process(command, check=False)
    assert result.returncode == 2
    assert "refusing to serve the store on 0.0.0.0:0 without a token" in result.stderr.decode()


async def test_token_file_defaults_to_the_environment(tmp_path: Path) -> None:
    """Without --token-file the server reads $AIOELASTIC_STORE_TOKEN_FILE."""
    token_file = tmp_path / "token"
    token_file.write_text("  \n")
    env = {**os.environ, "AIOELASTIC_STORE_TOKEN_FILE": str(token_file)}
    result = await anyio.run_process([*SERVER, "--port", "0"], check=False, env=env)
    assert result.returncode == 2
    assert f"the token file '{token_file}' is empty" in result.stderr.decode()


async def test_server_subprocess_serves_tls_clients_with_certificates(tmp_path: Path) -> None:
    """`--cacert --cert --key`: a client with a certificate from the CA is served over TLS."""
    from tests.reliability.test_store_tls import Pki

    pki = Pki(tmp_path)
    cert, key = pki.node("server")
    tls = ["--cacert", str(pki.cacert), "--cert", str(cert), "--key", str(key)]
    async with await anyio.open_process(
        [*SERVER, "--port", "0", *tls], stderr=subprocess.DEVNULL
    ) as process:
        assert process.stdout is not None
        with anyio.fail_after(30):  # generous: a cold interpreter start on a busy machine
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 200)
        port = int(line.decode().rsplit(":", 1)[1])
        async with pki.credentials("client").client("127.0.0.1", port) as store:
            await store.set("k", b"v")
            assert await store.get("k") == b"v"
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0
