"""A Redis too old for mcpfleet: the replica and the router each refuse to start, saying why.

The "Redis" is a few lines of RESP on a socket that answers ``INFO`` as Redis
6.2 would (and OK to everything else): the processes are the real
``mcpfleet serve`` and ``mcpfleet router``.
"""

from __future__ import annotations

import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpfleet.dev.ports import free_port

OLD = "6.2.14"


class _OldRedis(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:
            line = self.rfile.readline()
            if not line:
                return
            if not line.startswith(b"*"):
                continue
            parts = []
            for _ in range(int(line[1:])):
                size = int(self.rfile.readline()[1:])
                parts.append(self.rfile.read(size + 2)[:-2].decode())
            if parts and parts[0].upper() == "HELLO":
                # As Redis 6.2 answers (redis-py 8.2 opens with HELLO 3): a map in
                # RESP3, the same pairs as an array in RESP2.
                proto = int(parts[1]) if len(parts) > 1 else 2
                pairs = [("server", "redis"), ("version", OLD)]
                head = (
                    b"%%%d\r\n" % (len(pairs) + 1)
                    if proto == 3
                    else b"*%d\r\n" % (2 * len(pairs) + 2)
                )
                items = b"".join(
                    b"$%d\r\n%s\r\n" % (len(x), x.encode()) for pair in pairs for x in pair
                )
                self.wfile.write(head + items + b"$5\r\nproto\r\n:%d\r\n" % proto)
            elif parts and parts[0].upper() == "INFO":
                body = f"# Server\r\nredis_version:{OLD}\r\n".encode()
                self.wfile.write(b"$%d\r\n%s\r\n" % (len(body), body))
            else:  # connection set-up (CLIENT SETINFO, SELECT, ...): accepted
                self.wfile.write(b"+OK\r\n")


@pytest.fixture
def old_redis() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OldRedis)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def mcpfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcpfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(120)
def test_the_router_and_the_replica_refuse_a_redis_older_than_7(
    old_redis: int, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{old_redis}/0"
    keys = tmp_path / "keys"
    assert mcpfleet("keys", "generate", str(keys)).returncode == 0
    expected = f"Redis {OLD} is too old: mcpfleet needs Redis 7.0 or newer"
    router = mcpfleet("router", "--redis", url, "--port", str(free_port()))
    assert router.returncode != 0
    assert expected in router.stderr, router.stderr[-2000:]
    replica = mcpfleet("serve", "--keys", str(keys), "--redis", url, "--port", str(free_port()))
    assert replica.returncode != 0
    assert expected in replica.stderr, replica.stderr[-2000:]
