"""Fixtures the media tests share: direct and buffered I/O, a Redis cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.media import direct_io

from ..redis_server import RedisCluster


@pytest.fixture(params=[True, False], ids=["direct", "buffered"])
def direct(request: pytest.FixtureRequest, tmp_path: Path) -> bool:
    """Each test twice: with ``O_DIRECT`` (where the file system has it) and buffered."""
    if request.param and not direct_io.supports_direct_io(tmp_path):
        pytest.skip("the test file system does not support O_DIRECT")
    return bool(request.param)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A three-node Redis cluster on free loopback ports, one per test module."""
    c = RedisCluster(Path(tmp_path_factory.mktemp("cluster")))
    try:
        yield c.start()
    finally:
        c.stop()
