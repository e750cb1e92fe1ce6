"""vLLM's real scheduler and connector with kvtier's spec, and a fake model over CPU tensors.

Used by the vLLM 0.33 tests (vLLM installed ``--no-deps``: no compiled ops, so no real
model runs, but the scheduler side and the connector's worker half are pure Python).
``Harness`` builds vLLM's ``Scheduler`` (which builds vLLM's ``OffloadingConnector``,
which loads kvtier's spec by module path and calls ``get_manager``), and one vLLM
``OffloadingConnectorWorker`` per rank over kvtier's worker, each with its own "GPU"
KV tensor in host memory. Each step runs as vLLM's engine does: schedule, the workers
start transfers, the fake model writes the KV of every computed token, stores are
queued, results are aggregated across ranks (vLLM's ``KVOutputAggregator``) and fed
back.

The fake model's KV is a byte oracle: token ``p`` of a request, on rank ``r``, in KV
cache group ``g``, has the bytes of ``sha256(r, g, tokens[0..p])`` in its row of the
group's block. Before the model computes anything for a request, every row the
request already has (from the GPU prefix cache or loaded by kvtier) is checked against
that oracle; one wrong byte fails the test. A hybrid model (``windows``: a sliding
window per group, ``None`` for full attention) has one group per entry, all drawing
blocks from one pool of pages (one tensor, as vLLM's hybrid allocator shares them); a
sliding group's rows are checked where its window needs them (the ``window - 1``
tokens before the first computed one), a full group's everywhere.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import os
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from vllm import SamplingParams
    from vllm.config.kv_events import KVEventsConfig
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        SlidingWindowSpec,
    )
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager


BLOCK = 32
LAYERS = 2
HEAD = 32
PAGE = LAYERS * 2 * BLOCK * HEAD * 4  # one kv head per rank, fp32
ROW = PAGE // BLOCK  # bytes of one token in a page
IDLE_S = 60.0  # the longest a run waits on kvtier's I/O alone
EOS = 0


def token_bytes(rank: int, group: int, prefix_digest: bytes) -> np.ndarray:
    """The oracle's bytes of one token row."""
    digest = hashlib.sha256(bytes([rank, group]) + prefix_digest).digest()
    return np.frombuffer((digest * (ROW // 32 + 1))[:ROW], dtype=np.uint8)


@dataclass
class Rank:
    rank: int
    connector: Any
    kv: torch.Tensor  # (num_blocks, PAGE) uint8: the "GPU"


@dataclass
class Harness:
    """See the module doc. Build with ``Harness.build``."""

    scheduler: Any
    ranks: list[Rank]
    model_dir: Path
    windows: list[int | None] = field(default_factory=lambda: [None])
    digests: dict[str, list[bytes]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    checked_rows: int = 0
    steps: int = 0
    hold_rank: int | None = None  # a rank whose results are held back one step
    max_steps: int = 1000  # a run that has not drained by then fails (never hangs)
    _verified: set[str] = field(default_factory=set)
    last_meta: Any = None
    _held: Any = None
    # One aggregator for the engine's life, as vLLM's executor keeps: it counts each
    # request's finished transfers across steps until every rank has reported.
    _aggregator: Any = None
    # Each step's KV connector stats as vLLM's scheduler sends them to the front end.
    connector_stats: list[dict[str, Any]] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)  # what vLLM's event publisher got

    @classmethod
    def build(
        cls,
        model_dir: Path,
        extra_config: dict[str, Any],
        *,
        engine_id: str,
        num_gpu_blocks: int,
        world_size: int = 2,
        kv_events: bool = False,
        windows: list[int | None] | None = None,
        max_num_batched_tokens: int = 1024,
    ) -> Harness:
        args = EngineArgs(
            model=str(model_dir),
            skip_tokenizer_init=True,
            block_size=BLOCK,
            enable_prefix_caching=True,
            max_model_len=1024,
            max_num_seqs=4,
            max_num_batched_tokens=max_num_batched_tokens,
            dtype="float32",
            tensor_parallel_size=world_size,
            distributed_executor_backend="mp",
            kv_events_config=(
                KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None
            ),
            kv_transfer_config={
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "engine_id": engine_id,
                "kv_connector_extra_config": extra_config,
            },
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vllm_config = args.create_engine_config()
        vllm_config.scheduler_config.async_scheduling = False
        windows = windows or [None]
        groups = []
        for g, window in enumerate(windows):
            layers = [f"model.layers.{g * LAYERS + i}.self_attn.attn" for i in range(LAYERS)]
            shape = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": HEAD}
            kv_spec = (
                FullAttentionSpec(**shape, dtype=torch.float32)
                if window is None
                else SlidingWindowSpec(**shape, dtype=torch.float32, sliding_window=window)
            )
            groups.append(KVCacheGroupSpec(layers, kv_spec))
        kv_cache_config = KVCacheConfig(
            num_blocks=num_gpu_blocks,
            # The groups' layers overlay one allocation of PAGE bytes per block, as
            # vLLM's hybrid allocator lays them out (only the single-group layout
            # leaves the list empty, and vLLM then sums the groups' pages).
            kv_cache_tensors=[]
            if len(groups) == 1
            else [
                KVCacheTensor(
                    size=num_gpu_blocks * PAGE,
                    layers=[g.layer_names[0] for g in groups],
                    layer_stride=0,
                    block_stride=PAGE,
                )
            ],
            kv_cache_groups=groups,
        )
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        # Each worker builds the spec the scheduler's connector loads by module path.
        spec_cls = getattr(
            importlib.import_module(extra_config["spec_module_path"]), extra_config["spec_name"]
        )
        ranks = []
        for rank in range(world_size):  # vLLM starts the workers before the scheduler
            cfg = copy.deepcopy(vllm_config)
            cfg.parallel_config.rank = rank
            spec = spec_cls(build_offloading_config(cfg, kv_cache_config))
            connector = OffloadingConnectorWorker(spec, cfg, kv_cache_config)
            kv = torch.zeros((num_gpu_blocks, PAGE), dtype=torch.uint8)
            connector._init_worker(  # what register_kv_caches ends with
                CanonicalKVCaches(
                    tensors=[CanonicalKVCacheTensor(kv.view(torch.int8), PAGE)],
                    group_data_refs=[[CanonicalKVCacheRef(0, PAGE)] for _ in groups],
                )
            )
            ranks.append(Rank(rank, connector, kv))
        scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK,
            log_stats=True,
        )
        init_none_hash(get_hash_fn_by_name("sha256"))
        h = cls(scheduler, ranks, model_dir, windows)
        scheduler.kv_event_publisher.publish = lambda batch: h.events.extend(batch.events)
        return h

    @property
    def manager(self) -> Any:
        return self.scheduler.connector.connector_scheduler.manager

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 3) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        params.update_from_generation_config({}, EOS)
        hasher = get_request_block_hasher(BLOCK, get_hash_fn_by_name("sha256"))
        req = Request(req_id, list(prompt), params, None, block_hasher=hasher)
        self.tokens[req_id] = list(prompt)
        self.digests[req_id] = []
        self.scheduler.add_request(req)

    def _digest(self, req_id: str, upto: int) -> list[bytes]:
        digests, tokens = self.digests[req_id], self.tokens[req_id]
        while len(digests) < upto:
            prev = digests[-1] if digests else b""
            digests.append(
                hashlib.sha256(prev + tokens[len(digests)].to_bytes(4, "little")).digest()
            )
        return digests

    def _rows(self, rank: Rank, block_ids: list[int], start: int, stop: int):  # type: ignore[no-untyped-def]
        for p in range(start, stop):
            yield p, rank.kv[block_ids[p // BLOCK], (p % BLOCK) * ROW : (p % BLOCK + 1) * ROW]

    def step(self) -> None:
        """One engine step (see the module doc)."""
        assert self.steps < self.max_steps, (
            f"the scheduler did not drain in {self.max_steps} steps: "
            f"{len(self.scheduler.requests)} request(s) left"
        )
        so = self.scheduler.schedule()
        meta = so.kv_connector_metadata
        self.last_meta = meta
        # Each worker process gets its own copy of the metadata (vLLM serializes it),
        # and a worker changes its copy (it pops the stores a preemption flushes).
        metas = [copy.deepcopy(meta) for _ in self.ranks]
        for r, m in zip(self.ranks, metas, strict=True):
            r.connector.handle_preemptions(m)
            r.connector.start_kv_transfers(m)
            r.connector.worker.wait(set(m.load_jobs))  # loads land before the forward
        sampled: dict[str, int | None] = {}  # None: a prefill not finished this step
        manager = self.scheduler.kv_cache_manager
        for new in so.scheduled_new_reqs:
            self._forward(new.req_id, new.num_computed_tokens, manager, so, sampled)
        cached = so.scheduled_cached_reqs
        for req_id, done in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            self._forward(req_id, done, manager, so, sampled)
        outputs = []
        for r, m in zip(self.ranks, metas, strict=True):
            r.connector.prepare_store_kv(m)
            r.connector.start_kv_transfers(  # submit the deferred stores now, and wait:
                type(m)(load_jobs={}, store_jobs={})  # results are deterministic
            )
            r.connector.worker.wait(set(m.store_jobs))
            _, recving = r.connector.get_finished(so.finished_req_ids)
            outputs.append(
                ModelRunnerOutput(
                    req_ids=list(sampled),
                    req_id_to_index={k: i for i, k in enumerate(sampled)},
                    sampled_token_ids=[[] if t is None else [t] for t in sampled.values()],
                    kv_connector_output=KVConnectorOutput(
                        finished_recving=recving or None,
                        kv_connector_worker_meta=r.connector.build_connector_worker_meta(),
                    ),
                )
            )
        if self.hold_rank is not None:
            held, self._held = self._held, outputs[self.hold_rank]
            outputs[self.hold_rank] = held if held is not None else _empty(sampled)
        if self._aggregator is None:
            self._aggregator = KVOutputAggregator(len(self.ranks))
        merged = self._aggregator.aggregate(outputs)
        for eco in self.scheduler.update_from_output(so, merged).values():
            stats = eco.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                self.connector_stats.append(stats.kv_connector_stats)
        self.steps += 1

    def _forward(
        self, req_id: str, done: int, manager: Any, so: Any, sampled: dict[str, int | None]
    ) -> None:
        """The model's step for one request: ``done`` tokens are in its blocks already."""
        req = self.scheduler.requests[req_id]
        n = so.num_scheduled_tokens[req_id]
        tokens = self.tokens[req_id]
        digests = self._digest(req_id, min(done + n, len(tokens)))
        first = req_id not in self._verified
        self._verified.add(req_id)
        for g, window in enumerate(self.windows):
            block_ids = manager.get_block_ids(req_id)[g]
            needed = 0 if window is None else max(0, done - (window - 1))
            for r in self.ranks:
                if first and done > needed:  # what the prefix cache and kvtier gave it
                    self._check(req_id, r, g, block_ids, needed, done, digests)
                for p, row in self._rows(r, block_ids, done, min(done + n, len(tokens))):
                    row.copy_(torch.from_numpy(token_bytes(r.rank, g, digests[p]).copy()))
        if done + n >= req.num_prompt_tokens:
            token = 1 + int(hashlib.sha256(digests[-1]).digest()[0]) % 400
            sampled[req_id] = token
            self.tokens[req_id].append(token)
        else:  # a chunk of the prompt: nothing sampled
            sampled[req_id] = None

    def _check(
        self,
        req_id: str,
        r: Rank,
        group: int,
        block_ids: list[int],
        start: int,
        stop: int,
        digests: list[bytes],
    ) -> None:
        """Rows ``start..stop`` of a request's group hold the oracle's bytes."""
        for p, row in self._rows(r, block_ids, start, stop):
            if block_ids[p // BLOCK] == 0:
                raise AssertionError(
                    f"request {req_id} group {group}: token {p} is in vLLM's null block"
                )
            if not np.array_equal(row.numpy(), token_bytes(r.rank, group, digests[p])):
                raise AssertionError(
                    f"request {req_id} rank {r.rank} group {group}: token {p} (block "
                    f"{block_ids[p // BLOCK]}) holds wrong KV bytes"
                )
        self.checked_rows += stop - start

    def run(self) -> None:
        """Step until every request has finished (at most ``max_steps`` steps). Once
        only kvtier's own I/O is left (write-throughs, promotions: the connector's
        pending push work), steps wait a millisecond each and are not counted, for at
        most ``IDLE_S`` in all: a spinning loop would spend its steps before a loaded
        machine's disk write ends."""
        idle_until = None
        while self.scheduler.has_requests():
            sched = self.scheduler
            if sched.has_unfinished_requests() or sched.has_finished_requests():
                self.step()
                continue
            now = time.monotonic()
            idle_until = idle_until or now + IDLE_S
            assert now < idle_until, f"kvtier's I/O did not end in {IDLE_S} s"
            time.sleep(0.001)
            self.step()
            self.steps -= 1

    def shutdown(self) -> None:
        for r in self.ranks:
            r.connector.shutdown()
        self.scheduler.shutdown()


def conversation(blocks: int, seed: int = 3) -> list[int]:
    """``blocks`` blocks of seeded tokens: a conversation's history."""
    rng = random.Random(seed)
    return [rng.randrange(1, 500) for _ in range(blocks * BLOCK)]


def write_turn_by_turn(h: Harness, chat: list[int], turn_blocks: int = 2) -> None:
    """Send ``chat`` as a conversation, ``turn_blocks`` more of it each turn (plus one
    token of the turn's own), each turn run to its end: every turn stores only its new
    blocks, so a CPU tier smaller than the whole ``chat`` still writes all of it
    through to the tiers behind."""
    step = turn_blocks * BLOCK
    for turn in range(len(chat) // step):
        h.add(f"t{turn}", [*chat[: (turn + 1) * step], 7], max_tokens=2)
        h.run()


def _empty(sampled: dict[str, int | None]) -> Any:
    return ModelRunnerOutput(
        req_ids=list(sampled),
        req_id_to_index={k: i for i, k in enumerate(sampled)},
        sampled_token_ids=[[] if t is None else [t] for t in sampled.values()],
        kv_connector_output=KVConnectorOutput(),
    )
