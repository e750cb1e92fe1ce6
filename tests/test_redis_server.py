"""The test helper ``RedisServer`` (tests/redis_server.py): its port is picked free, not
reserved, so a first start that finds it taken moves to another; a restart keeps it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.redis_server import PortTaken, RedisServer, free_port


def test_a_port_taken_before_the_first_start_is_given_up_for_another(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    with socket.create_server(("127.0.0.1", free_port())) as taken:
        server.port = taken.getsockname()[1]  # as if another process bound it first
        server.start()
        try:
            assert server.port != taken.getsockname()[1]
            with server.client() as client:
                assert client.info("server")["process_id"] == server.proc.pid  # type: ignore[union-attr]
        finally:
            server.stop()


def test_a_restart_keeps_its_port_even_when_taken(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    port = server.port
    server.kill()
    with socket.create_server(("127.0.0.1", port)), pytest.raises(PortTaken):
        server.start()  # clients know this port: moving would hide the outage
    assert server.port == port and server.proc is None
    server.start()
    try:
        assert server.port == port
    finally:
        server.stop()
