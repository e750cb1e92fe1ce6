"""What leaves the engine process: metrics, failure logs and counts, KV events.

* ``failures``: why a job failed (a short reason), counted by tier, logged once.
* ``metrics``: ``EngineMetrics``, the Prometheus families in a registry per engine.
* ``exporter``: ``MetricsServer`` (``/metrics`` over HTTP, loopback by default).
* ``events``: KV event batches in vLLM's wire format (msgspec).
* ``publisher``: ``ZmqEventPublisher``, vLLM's ZeroMQ PUB/replay protocol.
* ``observer``: ``EngineObserver``, which feeds all of them from the values an engine
  produces (``EngineStats``, manager snapshots, events, ``TransferResult``).

Importing this package imports nothing third-party; ``metrics``/``exporter`` need
``prometheus_client`` and ``events``/``publisher`` need ``msgspec`` and ``pyzmq``
(the ``metrics`` extra: ``pip install 'kvtier[metrics]'``).
"""
