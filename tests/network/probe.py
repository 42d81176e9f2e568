"""Tiny network probes run inside hosts: ``python probe.py MODE ARGS...`` (stdlib only)."""

import socket
import sys
import time


def main(mode: str, *args: str) -> None:
    if mode == "serve":  # serve HOST PORT: accept and echo until killed
        server = socket.create_server((args[0], int(args[1])))
        print("ready", flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(1))
    elif mode == "connect":  # connect HOST PORT TIMEOUT: print ok, refused or timeout
        started = time.monotonic()
        try:
            with socket.create_connection((args[0], int(args[1])), timeout=float(args[2])) as s:
                s.sendall(b"x")
                s.recv(1)
            print(f"ok {time.monotonic() - started:.6f}")
        except ConnectionRefusedError:
            print("refused")
        except OSError:
            print("timeout")
    elif mode == "receive":  # receive PORT IDLE: count datagrams until IDLE s without one
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("0.0.0.0", int(args[0])))
        sock.settimeout(float(args[1]))
        print("ready", flush=True)
        count = 0
        try:
            while True:
                sock.recv(64)
                count += 1
        except TimeoutError:
            print(count, flush=True)
    elif mode == "send":  # send HOST PORT N: N datagrams
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(int(args[2])):
            sock.sendto(b"x", (args[0], int(args[1])))
            time.sleep(0.001)  # spread the datagrams over time  # pace
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
