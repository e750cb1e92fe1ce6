"""``LLM(metrics_port=...)``: /metrics scraped over HTTP adds up exactly to ``last_stats``."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from transformers import PreTrainedModel

from kvtier.blocks import Medium
from kvtier.engine import LLM, OffloadStats
from kvtier.engine.offload_connector import OffloadingConnector
from kvtier.errors import ConfigError
from kvtier.scheduler.tiering import TieredManager

from .engine_run import BLOCK_BYTES, GPU_BLOCKS, PAGE, chats, disk_cfg, scrape, tiers


def _value(
    sample: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return sample.get((name, frozenset(labels.items())), 0.0)


def test_scraped_counters_add_up_to_last_stats_after_every_call(
    tiny_model: PreTrainedModel, tmp_path: Path
) -> None:
    with LLM(
        model=tiny_model,
        num_gpu_blocks=GPU_BLOCKS,
        block_size=PAGE,
        offload=disk_cfg(tmp_path / "disk"),
        metrics_port=0,
    ) as llm:
        assert llm.metrics_url is not None and llm.metrics_url.startswith("http://127.0.0.1:")
        assert isinstance(llm.connector, OffloadingConnector)
        manager = llm.connector.manager
        assert isinstance(manager, TieredManager)
        totals, prompt, gpu_hits, computed = OffloadStats(), 0, 0, 0
        for requests, prompt_ids in enumerate(chats(), 1):
            llm.generate([prompt_ids], max_new_tokens=4)
            stats = llm.last_stats
            assert stats is not None
            totals = totals + stats.offload
            prompt += stats.prompt_tokens
            gpu_hits += stats.gpu_hit_blocks
            computed += sum(r.computed_tokens for r in stats.requests)
            m = scrape(llm.metrics_url)
            assert _value(m, "kvtier_requests_total") == requests
            assert _value(m, "kvtier_prompt_tokens_total") == prompt
            assert _value(m, "kvtier_computed_tokens_total") == computed
            assert _value(m, "kvtier_ttft_seconds_count") == requests
            assert _value(m, "kvtier_hit_blocks_total", tier="GPU") == gpu_hits
            assert _value(m, "kvtier_hit_tokens_total", tier="GPU") == gpu_hits * PAGE
            for tier in ("CPU", "DISK"):
                hits = totals.hit_blocks.get(Medium(tier), 0)
                assert _value(m, "kvtier_hit_blocks_total", tier=tier) == hits
                assert _value(m, "kvtier_hit_tokens_total", tier=tier) == hits * PAGE
            load, store = {"src": "CPU", "dst": "GPU"}, {"src": "GPU", "dst": "CPU"}
            assert _value(m, "kvtier_transfer_bytes_total", **load) == totals.bytes_loaded
            assert _value(m, "kvtier_transfer_bytes_total", **store) == totals.bytes_stored
            assert (
                _value(m, "kvtier_transfer_blocks_total", **load, outcome="ok")
                == totals.loaded_blocks
            )
            assert (
                _value(m, "kvtier_transfer_blocks_total", **store, outcome="ok")
                == totals.stored_blocks
            )
            assert _value(m, "kvtier_refused_blocks_total", tier="CPU", op="store") == (
                totals.refused_stores
            )
            assert _value(m, "kvtier_refused_blocks_total", tier="CPU", op="load") == (
                totals.refused_loads
            )
            failed = sum(v for (n, _), v in m.items() if n == "kvtier_failed_blocks_total")
            assert failed == sum(totals.failures.values()) == 0
            # The managers' own counters, read at the same moment.
            tiering = manager.stats()
            primary = manager.primary.stats()
            assert _value(m, "kvtier_lookups_total") == primary.lookups == requests
            assert _value(m, "kvtier_lookup_blocks_total") == primary.lookup_blocks
            assert _value(m, "kvtier_promoted_blocks_total", tier="DISK") == tiering.promotions
            assert _value(m, "kvtier_written_blocks_total", tier="DISK") == tiering.writes
            assert _value(m, "kvtier_skipped_blocks_total", reason="write_through") == (
                tiering.writes_skipped
            )
            for t in tiers(llm):
                name = str(t.medium)
                assert _value(m, "kvtier_evicted_blocks_total", tier=name) == t.stats().evictions
                assert (
                    _value(m, "kvtier_lookup_hit_blocks_total", tier=name)
                    == (tiering.hit_blocks[t.medium])
                )
                assert _value(m, "kvtier_tier_blocks", tier=name) == len(t)
                assert _value(m, "kvtier_tier_bytes", tier=name) == len(t) * BLOCK_BYTES
                assert _value(m, "kvtier_tier_capacity_blocks", tier=name) == t.num_blocks
            assert _value(m, "kvtier_tier_capacity_blocks", tier="CPU") == 8
            assert _value(m, "kvtier_write_queue_blocks") == manager.pending_writes
        # The workload went through every path the counters watch.
        assert totals.bytes_loaded > 0 and totals.hit_blocks.get(Medium.DISK, 0) > 0
        assert manager.stats().promotions > 0 and manager.primary.stats().evictions > 0
        url = llm.metrics_url
    with pytest.raises(OSError):  # closed with the engine
        scrape(url)


def test_the_registry_is_the_engines_own_and_can_be_mounted_elsewhere(
    tiny_model: PreTrainedModel, tmp_path: Path
) -> None:
    engines = [
        LLM(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE,
            offload=disk_cfg(tmp_path / str(i)))
        for i in range(2)
    ]  # fmt: skip
    try:
        a, b = engines
        assert a.metrics is not None and b.metrics is not None
        assert a.metrics.registry is not b.metrics.registry
        a.generate([chats()[0]], max_new_tokens=4)
        assert a.metrics.registry.get_sample_value("kvtier_requests_total") == 1
        assert b.metrics.registry.get_sample_value("kvtier_requests_total") == 0
        assert a.metrics_url is None  # not served: an embedder mounts the registry
        text = generate_latest(a.metrics.registry).decode()
        assert 'kvtier_tier_capacity_blocks{tier="CPU"} 8.0' in text
    finally:
        for llm in engines:
            llm.close()


def _threads_settled() -> set[threading.Thread]:
    """The live threads, once the metrics server's per-request handler threads are gone
    (each ends on its own schedule after its response was read)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        "process_request_thread" in t.name for t in threading.enumerate()
    ):
        time.sleep(0.01)
    return set(threading.enumerate())


def test_metrics_bind_loopback_unless_told_and_bad_ports_are_config_errors(
    tiny_model: PreTrainedModel,
) -> None:
    with LLM(model=tiny_model, num_gpu_blocks=8, block_size=PAGE, metrics_port=0) as llm:
        server = llm.observability.server
        assert server is not None and server.host == "127.0.0.1"
        # The port really is bound, on loopback: a whole request is served (so its
        # handler thread has run before the threads are counted).
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            assert r.status == 200 and b"kvtier_requests_total" in r.read()
        threads = _threads_settled()
        with pytest.raises(ConfigError) as err:
            LLM(model=tiny_model, num_gpu_blocks=8, block_size=PAGE, metrics_port=server.port)
        assert err.value.key == "metrics_port" and "in use" in str(err.value)
        assert _threads_settled() == threads  # nothing left running
    for bad in (-1, 65536, "9090", True):
        with pytest.raises(ConfigError) as err:
            LLM(model=tiny_model, num_gpu_blocks=8, block_size=PAGE, metrics_port=bad)  # type: ignore[arg-type]
        assert err.value.key == "metrics_port"
    with pytest.raises(ConfigError) as err:
        LLM(
            model=tiny_model, num_gpu_blocks=8, block_size=PAGE, kv_events={"endpoint": "tcp://*:0"}
        )
    assert err.value.key == "kv_events"  # events come from offloading tiers
