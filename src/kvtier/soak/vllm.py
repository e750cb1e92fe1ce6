"""``kvtier soak --engine vllm``: a real vLLM server with kvtier under the soak's faults.

Runs where vLLM is installed (vLLM's CPU build here). Two OpenAI servers
(``bench.vllm_server``) over one small seeded Llama: one without the connector, the
reference, which answers every prompt first; one with kvtier's spec, a CPU tier too
small for the conversations, a disk tier (in the soak's disk area) and a Redis tier
(the soak's own ``redis-server``). Every completion of the kvtier server is compared
token by token with the reference's, while the soak's ``Injector`` kills and stops
Redis, flips, tears and wipes block files and fills the disk, and the server is
SIGKILLed with its whole session (``engine_kill``; ``engine_kill_full_disk`` restarts
it on a full disk) and started again over the same disk directory.

A crash is the kvtier server failing a request or dying when the soak did not kill
it. kvtier's own counters are read from the server's ``/metrics`` before each kill
and at the end, so failed promotions (loads recomputed) are counted across restarts.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kvtier.bench.vllm import BLOCK, ModelShape, build_model
from kvtier.bench.vllm_server import ServerConfig, ServerError, VllmServer
from kvtier.soak.disk import DiskArea
from kvtier.soak.faults import Injector
from kvtier.soak.redis_proc import RedisProcess
from kvtier.soak.workload import Conversations, Turn

SOAK_SHAPE = ModelShape(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
)
"""Small enough that a request costs tens of milliseconds on 2 CPU cores."""

GPU_BLOCKS = 24
"""vLLM's own cache (768 tokens): it cannot keep eight conversations."""

DISK_AREA_BYTES = 64 << 20

COUNTERS = {
    "promotions": "vllm:kv_offload_kvtier_promotions_total",
    "promotion_failures": "vllm:kv_offload_kvtier_promotion_failures_total",
    "write_failures": "vllm:kv_offload_kvtier_write_failures_total",
    "store_failures": "vllm:kv_offload_kvtier_store_failures_total",
    "tier_hits": "vllm:kv_offload_kvtier_tier_hits_total",
}
"""kvtier's counters under vLLM, summed over the server's lives, by label."""


@dataclass(frozen=True, slots=True)
class VllmSoakOptions:
    duration_s: float = 180.0
    seed: int = 0
    fault_interval_s: float = 6.0
    max_requests: int = 1_000_000
    request_timeout_s: float = 120.0


class _Reference:
    """The server without kvtier, as the soak workload's reference engine."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], max_new_tokens: int
    ) -> list[list[int]]:
        return [list(self.server.complete(p, max_new_tokens).tokens) for p in prompt_token_ids]


class VllmSoak:
    """One soak run of vLLM with kvtier in ``workdir``."""

    def __init__(self, options: VllmSoakOptions, workdir: Path, out: TextIO = sys.stdout) -> None:
        self.opt = options
        self.workdir = workdir
        self.out = out
        self.rng = random.Random(options.seed)
        self.counts = dict.fromkeys(
            ["requests_served", "tokens_compared", "wrong_tokens", "wrong_completions"], 0
        )
        self.counts |= {"server_crashes": 0, "server_restarts": 0}
        self.kvtier: dict[str, dict[str, float]] = {name: {} for name in COUNTERS}
        self.messages: list[str] = []
        self.restart_s: list[float] = []

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def run(self) -> dict[str, Any]:
        model = self.workdir / "model"
        build_model(model, SOAK_SHAPE)
        redis = RedisProcess(self.workdir / "redis", maxmemory="256mb")
        disk = DiskArea(self.workdir / "disk", DISK_AREA_BYTES)
        disk.engine_dir("vllm").mkdir(parents=True, exist_ok=True)
        self._say(f"soak: disk area: {disk.mode}; redis-server on port {redis.port}")
        injector = Injector(redis, disk, ("vllm",), random.Random(self.opt.seed + 1))
        reference = kvtier = None
        try:
            redis.start()
            reference = VllmServer(
                self._config(model, None), self.workdir / "reference.log", wait=False
            )
            kvtier = self._start(model, disk, redis.url, wait=False)
            reference.wait_ready()
            kvtier.wait_ready()
            workload = Conversations(_Reference(reference), SOAK_SHAPE.vocab_size, self.opt.seed)
            kvtier = self._loop(kvtier, model, disk, redis.url, injector, workload)
        finally:
            injector.heal(time.monotonic(), everything=True)
            if kvtier is not None and kvtier.alive:
                self._read_counters(kvtier)
                kvtier.stop()
            if reference is not None:
                reference.stop()
            corrupt_at_end = len(disk.corrupt_blocks("vllm", injector.damaged))
            redis.close()
            disk.close()
        restarts = sorted(self.restart_s)
        return {
            **self.counts,
            "faults": dict(injector.injected),
            "faults_that_found_no_block_file": {k: v for k, v in injector.no_effect.items() if v},
            "failed_loads_recomputed": sum(self.kvtier["promotion_failures"].values()),
            "kvtier_counters": {k: dict(sorted(v.items())) for k, v in self.kvtier.items()},
            "corrupt_blocks_at_end": corrupt_at_end,
            "server_restart_s_median": round(restarts[len(restarts) // 2], 1) if restarts else None,
            "disk_area": disk.mode,
            "crash_messages": self.messages[:5],
        }

    # -- servers -----------------------------------------------------------------------

    def _config(self, model: Path, kv_transfer: dict[str, Any] | None) -> ServerConfig:
        return ServerConfig(
            model=model,
            kv_transfer=kv_transfer,
            block_size=BLOCK,
            num_gpu_blocks=GPU_BLOCKS,
            page_bytes=SOAK_SHAPE.page_bytes,
            max_model_len=GPU_BLOCKS * BLOCK - BLOCK,
        )

    def _start(
        self, model: Path, disk: DiskArea, redis_url: str, *, wait: bool = True
    ) -> VllmServer:
        extra = {
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.integrations.vllm",
            "cpu_bytes_to_use": 48 * SOAK_SHAPE.page_bytes,
            "disk_path": str(disk.engine_dir("vllm")),
            "disk_bytes_to_use": "16MiB",
            "remote_url": redis_url,
            "remote_timeout_s": 0.5,
            "shm_dir": str(self.workdir),
        }
        kv = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
        kv["kv_connector_extra_config"] = extra  # type: ignore[assignment]
        log = self.workdir / f"kvtier-{self.counts['server_restarts']}.log"
        return VllmServer(self._config(model, kv), log, wait=wait)

    def _read_counters(self, server: VllmServer) -> None:
        try:
            samples = server.metrics()
        except (OSError, ServerError):
            return
        for name, metric in COUNTERS.items():
            for (sample, labels), value in samples.items():
                if sample == metric:
                    label = ",".join(
                        f"{k}={v}" for k, v in sorted(labels) if k in ("tier", "reason")
                    )
                    totals = self.kvtier[name]
                    totals[label or "all"] = totals.get(label or "all", 0.0) + value

    # -- the loop ----------------------------------------------------------------------

    def _loop(
        self,
        server: VllmServer,
        model: Path,
        disk: DiskArea,
        redis_url: str,
        injector: Injector,
        workload: Conversations,
    ) -> VllmServer:
        start = time.monotonic()
        deadline = start + self.opt.duration_s
        next_fault = start + self.rng.expovariate(1 / self.opt.fault_interval_s)
        while (time.monotonic() < deadline or not injector.every_kind_injected) and self.counts[
            "requests_served"
        ] < self.opt.max_requests:
            now = time.monotonic()
            injector.heal(now)
            if now >= next_fault:
                kind = injector.next_kind()
                injector.inject(kind, now)
                if kind.startswith("engine_kill"):
                    server = self._kill_and_restart(server, model, disk, redis_url, kind)
                next_fault = time.monotonic() + self.rng.expovariate(1 / self.opt.fault_interval_s)
            turn = workload.next_turn()
            server = self._serve(server, turn, model, disk, redis_url)
        return server

    def _serve(
        self, server: VllmServer, turn: Turn, model: Path, disk: DiskArea, redis_url: str
    ) -> VllmServer:
        for _ in range(3):
            try:
                got = server.complete(
                    list(turn.prompt), len(turn.expected), self.opt.request_timeout_s
                )
            except ServerError as e:
                self.counts["server_crashes"] += 1
                self.messages.append(str(e)[-2000:])
                self._say(f"soak: SERVER CRASH: {str(e).splitlines()[0][:300]}")
                server.kill()
                server = self._restarted(model, disk, redis_url)
                continue
            self._check(turn, got.tokens)
            return server
        raise RuntimeError("the kvtier server failed the same request three times")

    def _check(self, turn: Turn, tokens: tuple[int, ...]) -> None:
        want = turn.expected
        wrong = sum(g != w for g, w in zip(tokens, want, strict=False)) + abs(
            len(tokens) - len(want)
        )
        self.counts["requests_served"] += 1
        self.counts["tokens_compared"] += len(want)
        self.counts["wrong_tokens"] += wrong
        self.counts["wrong_completions"] += bool(wrong)
        if wrong:
            self._say(f"soak: WRONG COMPLETION: conversation {turn.conversation}")

    def _kill_and_restart(
        self, server: VllmServer, model: Path, disk: DiskArea, redis_url: str, kind: str
    ) -> VllmServer:
        self._read_counters(server)
        server.kill()
        if kind == "engine_kill_full_disk":
            disk.fill()
        try:
            return self._restarted(model, disk, redis_url)
        finally:
            if kind == "engine_kill_full_disk":
                disk.unfill()

    def _restarted(self, model: Path, disk: DiskArea, redis_url: str) -> VllmServer:
        t0 = time.monotonic()
        self.counts["server_restarts"] += 1
        server = self._start(model, disk, redis_url)
        self.restart_s.append(time.monotonic() - t0)
        return server
