"""``LLM``: the reference engine's public entry point, and its loop.

Runs in one process: the scheduler and the connector's scheduler half in Python, the
forward passes and the KV pool on the model's device (CUDA when available, else CPU).
The connector's worker half runs here too, or in a child process (``worker_process``).

    >>> llm = LLM(num_gpu_blocks=256, block_size=16)
    >>> outputs = llm.generate([[1, 2, 3, 4]], max_new_tokens=8)
    >>> llm.last_stats.ttft_s
"""

from __future__ import annotations

import itertools
import operator
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from kvtier.config import OffloadingConfig, positive_int
from kvtier.engine.block_manager import BlockManager
from kvtier.engine.connector_api import Connector, NoOpConnector
from kvtier.engine.kv_pool import KVPool, KVShape
from kvtier.engine.model_runner import ModelRunner
from kvtier.engine.models import load_model, model_fingerprint
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.engine.request import Request
from kvtier.engine.request_scheduler import Scheduler
from kvtier.engine.stats import EngineStats
from kvtier.errors import ConfigError
from kvtier.interrupts import critical, default_ctrl_c_deferred
from kvtier.keys import BlockHasher
from kvtier.observability.engine import Observability
from kvtier.offloading_spec import KVGeometry, OffloadingSpec

_POLL_INTERVAL_S = 1e-4
"""Sleep between polls while every request waits on the connector."""


class LLM:
    """A small paged-KV inference engine over a Hugging Face causal LM (greedy decoding).

    Args:
        model: ``None`` for the embedded default model (seeded random weights), a path to
            a local Hugging Face checkpoint directory, or a model instance.
        num_gpu_blocks: pages in the KV pool (the GPU prefix cache's capacity).
        block_size: tokens per page.
        offload: offloading configuration (``docs/configuration.md``), e.g.
            ``{"cpu_bytes_to_use": "2GiB", "eviction_policy": "arc"}``; ``None``: no
            offloading.
        connector: a ready-made offloading connector (see ``connector_api``), for
            embedders and tests; ``offload`` builds one from configuration. It is
            given the pool's tensors (``register_kv_caches``) before any request.
        device: where the model runs (default: CUDA if available, else CPU). Ignored
            for a model instance, which runs where it is.
        seed: the default model's weights seed.
        max_batch_size: most requests admitted and decoded together.
        prefill_chunk: most tokens one prefill forward pass runs.
        worker_process: run offloading's worker half (its handlers, host memory and
            stores) in a child process, as an engine with one process per GPU would;
            only job values cross between the processes.
        metrics_port: serve Prometheus metrics at ``/metrics`` on this TCP port (0: a
            free one, see ``metrics_url``); ``None``: not served, but ``metrics``
            still holds this engine's registry to mount elsewhere.
        metrics_host: the address ``/metrics`` is served on (default loopback).
        kv_events: publish KV events over ZeroMQ in vLLM's format, e.g.
            ``{"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}``
            (``docs/observability.md``); needs ``offload``.

    Raises:
        ConfigError: an argument is invalid (the message names it).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | PreTrainedModel | None = None,
        num_gpu_blocks: int = 1024,
        block_size: int = 16,
        offload: Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        max_batch_size: int = 8,
        prefill_chunk: int = 2048,
        connector: Connector | None = None,
        worker_process: bool = False,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        kv_events: Mapping[str, Any] | None = None,
    ) -> None:
        for key, value in (
            ("num_gpu_blocks", num_gpu_blocks),
            ("block_size", block_size),
            ("max_batch_size", max_batch_size),
            ("prefill_chunk", prefill_chunk),
        ):
            positive_int(key, value)
        if offload is not None and connector is not None:
            raise ConfigError("offload", "give either offload or connector, not both")
        if connector is not None and not isinstance(connector, Connector):
            raise ConfigError("connector", f"{type(connector).__name__} is not a Connector")
        if offload is not None and not isinstance(offload, Mapping):
            raise ConfigError(
                "offload", f"must be a dict of offloading keys or None, got {offload!r}"
            )
        offload_config = OffloadingConfig.from_dict(offload) if offload is not None else None
        if kv_events is not None and offload is None and connector is None:
            raise ConfigError("kv_events", "needs offload=...: events come from its tiers")
        self.observability = Observability(metrics_port, metrics_host, kv_events)
        self.metrics = self.observability.metrics
        """This engine's ``EngineMetrics`` (its ``registry`` can be mounted), or ``None``
        without ``prometheus_client``."""
        if isinstance(model, PreTrainedModel):
            self.model = model
            self.model.train(False)  # eval mode
        else:
            self.model = load_model(model, device=device, seed=seed)
        layout = KVShape.of_model(self.model)
        self.pool = KVPool(layout, num_gpu_blocks, block_size, self.model.device)
        fingerprint = model_fingerprint(self.model, layout, block_size)
        hasher = BlockHasher(
            fingerprint, offload_config.hash_algorithm if offload_config else "sha256"
        )
        if offload_config is not None:
            geometry = KVGeometry(block_size, self.pool.bytes_per_block, fingerprint)
            spec = OffloadingSpec(offload_config, geometry)
            connector = OffloadingConnector(spec, worker_process=bool(worker_process))
        connector = connector if connector is not None else NoOpConnector()
        self.block_manager = BlockManager(num_gpu_blocks, on_evict=connector.on_gpu_evict)
        self.scheduler = Scheduler(
            self.block_manager,
            connector,
            block_size,
            max_batch_size,
            prefill_chunk,
            hasher.hash_prompt,
        )
        self.runner = ModelRunner(self.model, self.pool)
        connector.register_kv_caches(self.pool.kv_caches, block_size)
        self.connector = connector
        try:
            self.observability.start(connector)
        except BaseException:
            connector.close()
            raise
        self.last_stats: EngineStats | None = None
        self._ids = itertools.count()

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], max_new_tokens: int
    ) -> list[list[int]]:
        """Greedy-decode ``max_new_tokens`` tokens after each prompt; sets ``last_stats``.

        Prompts are admitted in order and share the GPU prefix cache (within the call
        and with earlier calls). Returns the generated tokens only, one list per prompt.

        Raises:
            ConfigError: a prompt is empty or holds a token outside the vocabulary, or
                ``max_new_tokens`` is not a positive integer.
            CapacityError: a request cannot fit in the pool even alone.
        """
        requests = self._make_requests(prompt_token_ids, max_new_tokens)
        for req in requests:
            self.scheduler.check_fits(req)
        with default_ctrl_c_deferred():  # Ctrl-C never cuts the connector's hand-overs
            return self._generate(requests)

    def _generate(self, requests: list[Request]) -> list[list[int]]:
        start = time.perf_counter()
        for req in requests:
            req.arrival_s = start
            self.scheduler.add(req)
        # The scheduler's steps are ``critical``: a Ctrl-C waits until what the connector
        # hands back (released requests, load handles) is in the engine's books; the
        # forward pass and the sleeps stay interruptible.
        while self.scheduler.has_unfinished:
            with critical:
                batch = self.scheduler.schedule()
            if batch is None:  # every request waits on the connector
                time.sleep(_POLL_INTERVAL_S)
                continue
            next_tokens = self.runner.run(batch.inputs)
            with critical:
                self.scheduler.update(batch, next_tokens, time.perf_counter())
        wall_s = time.perf_counter() - start
        while self.scheduler.has_held:  # stores still reading finished requests' pages
            with critical:
                self.scheduler.release(self.connector.poll())
            time.sleep(_POLL_INTERVAL_S)
        self.last_stats = self.observability.finish_generate(
            EngineStats(
                requests=tuple(r.stats(start) for r in requests),
                block_size=self.pool.block_size,
                wall_s=wall_s,
                offload=self.connector.take_stats(),
            )
        )
        return [list(r.output_token_ids) for r in requests]

    @property
    def metrics_url(self) -> str | None:
        """Where ``/metrics`` is served, or ``None``."""
        server = self.observability.server
        return None if server is None else server.url

    def close(self) -> None:
        """Let offloading finish its work in flight, then release its memory and files;
        publish the last KV events and stop serving metrics."""
        try:
            with default_ctrl_c_deferred():
                self.connector.close()
        finally:
            self.observability.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_requests(
        self, prompt_token_ids: Sequence[Sequence[int]], max_new_tokens: int
    ) -> list[Request]:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ConfigError("max_new_tokens", f"must be an integer, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ConfigError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
        if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
            raise ConfigError("prompt_token_ids", "must be a list of token-id lists")
        vocab = self.model.config.get_text_config().vocab_size
        requests = []
        for i, prompt in enumerate(prompt_token_ids):
            where = f"prompt_token_ids[{i}]"
            if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
                raise ConfigError(where, "must be a list of token ids (ints)")
            if len(prompt) == 0:
                raise ConfigError(where, "is empty; a prompt needs at least one token")
            try:
                tokens = tuple(operator.index(t) for t in prompt)
            except TypeError as e:
                raise ConfigError(where, f"must hold integer token ids ({e})") from e
            bad = next((t for t in tokens if not 0 <= t < vocab), None)
            if bad is not None:
                raise ConfigError(where, f"token {bad} is outside the vocabulary [0, {vocab})")
            requests.append(
                Request(
                    request_id=str(next(self._ids)),
                    prompt_token_ids=tokens,
                    max_new_tokens=max_new_tokens,
                    arrival_s=0.0,
                )
            )
        return requests
