"""``Observability``: the metrics endpoint, KV events and failure log of one ``LLM``.

Runs in the engine process. The engine builds it from its arguments before anything
is allocated (bad values raise ``ConfigError`` first), ``start``s it once its
connector is ready, hands it each ``generate`` call's stats, and closes it after the
connector. It is the one place that knows how the reference engine's
``OffloadingConnector`` exposes its manager, spec and worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvtier.errors import ConfigError
from kvtier.observability.exporter import DEFAULT_HOST, check_port
from kvtier.observability.guard import RecordingGuard

if TYPE_CHECKING:
    from kvtier.engine.connector_api import Connector
    from kvtier.engine.stats import EngineStats
    from kvtier.observability.exporter import MetricsServer
    from kvtier.observability.metrics import EngineMetrics
    from kvtier.observability.observer import EngineObserver
    from kvtier.observability.publisher import KVEventsConfig, ZmqEventPublisher

_INSTALL = "pip install 'kvtier[metrics]'"


def new_metrics() -> EngineMetrics | None:
    """An engine's metrics, or ``None`` when ``prometheus_client`` is not installed."""
    try:
        from kvtier.observability.metrics import EngineMetrics
    except ImportError:
        return None
    return EngineMetrics()


class Observability:
    """See the module docstring.

    Args:
        metrics_port: serve ``/metrics`` on this TCP port (0: any free one; ``None``:
            do not serve; the registry is still there to mount).
        metrics_host: the address to serve on (loopback by default).
        kv_events: publish KV events (``KVEventsConfig`` keys), or ``None``.

    Raises:
        ConfigError: a value is invalid, or what it needs is not installed.
    """

    def __init__(
        self,
        metrics_port: int | None = None,
        metrics_host: str = DEFAULT_HOST,
        kv_events: Mapping[str, Any] | None = None,
    ) -> None:
        if metrics_port is not None:
            check_port("metrics_port", metrics_port)
        if not isinstance(metrics_host, str) or not metrics_host:
            raise ConfigError(
                "metrics_host", f"must be a host name or address, got {metrics_host!r}"
            )
        self.metrics = new_metrics()
        if metrics_port is not None and self.metrics is None:
            raise ConfigError("metrics_port", f"needs prometheus_client: {_INSTALL}")
        self.events_config: KVEventsConfig | None = None
        if kv_events is not None:
            try:
                from kvtier.observability.publisher import KVEventsConfig
            except ImportError as e:
                raise ConfigError("kv_events", f"needs msgspec and pyzmq ({e}): {_INSTALL}") from e
            self.events_config = KVEventsConfig.from_dict(kv_events)
        self._port = metrics_port
        self._host = metrics_host
        self.server: MetricsServer | None = None
        self.publisher: ZmqEventPublisher | None = None
        self.observer: EngineObserver | None = None
        self.guard = RecordingGuard()  # the engine's own counters, without offloading

    def start(self, connector: Connector) -> None:
        """Serve metrics, open the publisher and watch ``connector``'s work.

        Raises:
            ConfigError: the port or an endpoint cannot be used, or events were asked
                of an engine without offloading (nothing would ever be published).
        """
        from kvtier.engine.offload_connector import OffloadingConnector

        if self.events_config is not None and not isinstance(connector, OffloadingConnector):
            raise ConfigError("kv_events", "needs offloading (offload=...): events come from tiers")
        try:
            if self._port is not None:
                from kvtier.observability.exporter import MetricsServer

                assert self.metrics is not None
                self.server = MetricsServer(self.metrics.registry, self._port, self._host)
            if self.events_config is not None:
                from kvtier.observability.publisher import ZmqEventPublisher

                self.publisher = ZmqEventPublisher(self.events_config)
            if isinstance(connector, OffloadingConnector):
                self.observer = _observe(connector, self)
        except BaseException:
            self.close()
            raise

    def finish_generate(self, stats: EngineStats) -> EngineStats:
        """A ``generate`` call's stats, with its failures; recorded and published."""
        if self.observer is not None:
            return self.observer.finish_generate(stats)
        metrics = self.metrics
        if metrics is not None:  # no offloading: the engine's own counters still count
            from kvtier.observability.observer import record_stats

            self.guard.run("metrics", lambda: record_stats(metrics, stats, stats.block_size), None)
        return stats

    @property
    def recording_failures(self) -> int:
        """Metric and event records that raised and were dropped (logged once a kind)."""
        return self.guard.failures + (self.observer.guard.failures if self.observer else 0)

    def close(self) -> None:
        """After the connector closed: last events, then stop publishing and serving."""
        if self.observer is not None:
            self.observer.close()
            self.guard.failures += self.observer.guard.failures  # kept past close
            self.observer = None
        elif self.publisher is not None:
            self.publisher.close()
        self.publisher = None
        if self.server is not None:
            self.server.close()
            self.server = None


def _observe(connector: Any, obs: Observability) -> EngineObserver:
    """An observer of the reference engine's ``OffloadingConnector``."""
    from kvtier.blocks import Medium
    from kvtier.observability.observer import EngineObserver

    spec = connector.spec
    where: dict[Medium, str] = {}
    shared: dict[Medium, Any] = {}
    if spec.config.disk_path is not None:
        where[Medium.DISK] = spec.config.disk_path
    if spec.has_remote:
        where[Medium.REMOTE] = spec.config.remote_url
        shared[Medium.REMOTE] = spec.remote_store()
    observer = EngineObserver(
        connector.manager,
        spec.bytes_per_block,
        shared=shared,
        where=where,
        metrics=obs.metrics,
        publisher=obs.publisher,
        int_hashes=obs.events_config.int_hashes if obs.events_config else False,
    )
    connector.add_observer(observer.on_transfer)
    return observer
