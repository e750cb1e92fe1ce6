"""Serving metrics over HTTP: ``MetricsServer``, and ``LabeledRegistries`` for many engines.

Runs in the engine process; the HTTP server answers on a daemon thread of its own
(``prometheus_client``'s WSGI server), reading the registry at each scrape. It binds
loopback (``127.0.0.1``) unless told otherwise: metrics name tiers, paths of nothing
and keys of nothing, but an operator opens them to a network on purpose.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvtier.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"


def check_port(key: str, port: object) -> int:
    """A TCP port (0: any free one). Raises ``ConfigError`` naming ``key`` otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(key, f"must be a TCP port 0..65535 (0: any free port), got {port!r}")
    return port


class MetricsServer:
    """``/metrics`` of ``registry`` over HTTP on ``host:port``.

    Args:
        registry: what to serve (a ``CollectorRegistry`` or any collector).
        port: the TCP port; 0 picks a free one (see ``port`` after start).
        host: the address to bind (loopback by default).

    Raises:
        ConfigError: the address cannot be bound (port in use, unknown host).
    """

    def __init__(self, registry: Collector, port: int, host: str = DEFAULT_HOST) -> None:
        check_port("metrics_port", port)
        if not isinstance(host, str) or not host:
            raise ConfigError("metrics_host", f"must be a host name or address, got {host!r}")
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise ConfigError("metrics_port", f"cannot serve metrics on {host}:{port}: {e}") from e
        self.host = host
        self.port: int = self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """Where to scrape."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop answering and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)


class LabeledRegistries(Collector):
    """Several engines' registries as one exposition, each sample labelled with its engine.

    ``kvtier run`` serves its configurations' engines on one port this way: every
    sample of engine ``name`` gets ``label="name"``. Engines may be added while it is
    being scraped.

    Args:
        label: the label that tells the engines apart (e.g. ``"config"``).
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._lock = threading.Lock()
        self._parts: list[tuple[str, Collector]] = []

    def add(self, name: str, registry: Collector) -> None:
        with self._lock:
            self._parts.append((name, registry))

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            parts = list(self._parts)
        merged: dict[str, Metric] = {}
        for name, registry in parts:
            for family in registry.collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for s in family.samples:
                    out.samples.append(s._replace(labels={self.label: name, **s.labels}))
        return list(merged.values())
