"""The scheduler: which requests get pages, and what the next forward pass runs.

Runs in the engine process; pure Python (pages are ids, tokens are ints). Each step:

1. ``connector.poll()``; release the pages of finished requests it stopped reading;
   requests whose loads completed start running (loaded pages join the prefix cache;
   pages whose load failed are recomputed).
2. Admit waiting requests in arrival order while pages allow: GPU prefix match, then
   (a) ask the connector for more hits (or wait a step, if it is still finding out);
   allocate all prompt pages; (b) start the load.
   A request whose next block an admitted request is computing or loading waits for
   it instead, so that prompts sharing a prefix in one batch compute it once.
3. Pick the batch: one prefill chunk if any running request still has prompt to
   compute (prefill first: it sets TTFT), else one decode token for every running
   request, each given a page when it needs one -- preempting the most recently
   admitted requests when none is left (their full pages stay cached).

After the forward pass, ``update`` appends the sampled tokens, names newly full pages
in the prefix cache and tells the connector (c); finished requests go to (f).

Token accounting: a request runs ``all_token_ids[num_computed_tokens:]``; the forward
that reaches its last token samples the next one. A decode step is just that with one
token to run, so a prompt whose every block but the last token hit goes straight to
decoding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.blocks import BlockHash
from kvtier.engine.block_manager import BlockManager
from kvtier.engine.connector_api import Connector, LoadState
from kvtier.engine.model_runner import SeqInput
from kvtier.engine.request import Request, RequestStatus
from kvtier.errors import CapacityError, ProtocolError


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """What one forward pass runs: ``inputs[i]`` belongs to ``requests[i]``."""

    requests: tuple[Request, ...]
    inputs: tuple[SeqInput, ...]
    is_prefill: bool


class Scheduler:
    """Admits, loads, prefills, decodes and preempts requests over a ``BlockManager``.

    Args:
        block_manager: the GPU prefix cache.
        connector: the offloading connector (``NoOpConnector`` for none).
        block_size: tokens per page.
        max_batch_size: most requests admitted at once (and decoded together).
        prefill_chunk: most tokens one prefill forward pass runs.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        connector: Connector,
        block_size: int,
        max_batch_size: int,
        prefill_chunk: int,
        hash_blocks: Callable[[Sequence[int]], list[BlockHash]],
    ) -> None:
        self.bm = block_manager
        self.hash_blocks = hash_blocks
        self.connector = connector
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.loading: list[Request] = []
        self.running: list[Request] = []
        self.held: dict[str, Request] = {}
        self.connector_pending = False  # (a) answered "ask again" this step

    def check_fits(self, request: Request) -> None:
        """Ask before ``add``.

        Raises:
            CapacityError: the request could never fit in the pool, even alone.
        """
        # The last sampled token is never fed back, so it needs no page.
        max_tokens = len(request.prompt_token_ids) + request.max_new_tokens - 1
        needed = self._blocks_for(max_tokens)
        if needed > self.bm.num_blocks:
            raise CapacityError(
                f"request {request.request_id} needs {needed} KV blocks "
                f"({max_tokens} tokens / {self.block_size} per block) but the pool has "
                f"{self.bm.num_blocks}: raise num_gpu_blocks or shorten the request"
            )

    def add(self, request: Request) -> None:
        """Queue a request (``check_fits`` first)."""
        self.check_fits(request)
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.loading or self.running)

    @property
    def has_held(self) -> bool:
        """Finished requests whose pages the connector still reads."""
        return bool(self.held)

    def schedule(self) -> ScheduledBatch | None:
        """Run steps 1-3; ``None`` when nothing can run until a load or release completes.

        Raises:
            ProtocolError: nothing can run and nothing is pending (a stall).
        """
        self.release(self.connector.poll())
        self._finish_loads()
        self._admit()
        for req in self.running:
            if req.num_computed_tokens < req.num_tokens - 1:
                end = min(req.num_tokens, req.num_computed_tokens + self.prefill_chunk)
                return self._batch([req], end, is_prefill=True)
        decode = self._reserve_decode_pages()
        if decode:
            return ScheduledBatch(
                requests=tuple(decode),
                inputs=tuple(self._input(r, r.num_tokens) for r in decode),
                is_prefill=False,
            )
        if not (self.loading or self.held or self.connector_pending) and self.has_unfinished:
            raise ProtocolError("scheduler stalled: requests wait but nothing can run")
        return None

    def update(self, batch: ScheduledBatch, next_tokens: Sequence[int], now_s: float) -> None:
        """Account one forward pass: sampled tokens, full pages, finished requests."""
        for req, inp, token in zip(batch.requests, batch.inputs, next_tokens, strict=True):
            start = req.num_computed_tokens
            req.num_computed_tokens += len(inp.token_ids)
            req.computed_tokens += max(0, min(req.num_computed_tokens, req.prefill_end) - start)
            if req.num_computed_tokens == req.num_tokens:
                req.output_token_ids.append(token)
                if req.first_token_s is None:
                    req.first_token_s = now_s
            self._commit_full_blocks(req)
            if req.is_finished:
                self._finish(req)

    def release(self, request_ids: Sequence[str]) -> None:
        """Free the pages of finished requests the connector stopped reading."""
        for request_id in request_ids:
            req = self.held.pop(request_id, None)
            if req is None:
                raise ProtocolError(f"connector released unknown request {request_id!r}")
            self.bm.free(req.block_table)
            req.block_table = []

    # -- steps -----------------------------------------------------------------------------

    def _finish_loads(self) -> None:
        for req in list(self.loading):
            load = req.load
            assert load is not None
            if load.state is LoadState.PENDING:
                continue
            # Loaded pages are as good as computed: name them so later requests hit them.
            # Pages after the first failure are simply recomputed by the prefill.
            start = req.num_committed_blocks
            for i in range(start, start + load.num_loaded_blocks):
                self.bm.commit(req.block_table[i], req.block_keys[i])
            req.num_committed_blocks += load.num_loaded_blocks
            req.num_computed_tokens += load.num_loaded_blocks * self.block_size
            if req.admissions == 1:
                req.loaded_blocks = load.num_loaded_blocks
            req.load = None
            req.status = RequestStatus.RUNNING
            self.loading.remove(req)
            self.running.append(req)

    def _admit(self) -> None:
        self.connector_pending = False
        while self.waiting and len(self.running) + len(self.loading) < self.max_batch_size:
            req = self.waiting[0]
            keys = self.hash_blocks(req.all_token_ids)
            # At least the last token is always computed: its logits give the next one.
            max_hits = (req.num_tokens - 1) // self.block_size
            hits = self.bm.lookup(keys[:max_hits])
            if len(hits) < max_hits and keys[len(hits)] in self._keys_in_flight():
                return  # an admitted request is computing (or loading) this prefix: wait
            num_new = self._blocks_for(req.num_tokens) - len(hits)
            if not self.bm.can_allocate(hits, num_new):
                return
            ext = self.connector.get_num_external_hit_blocks(req, keys, len(hits))
            if ext is None:  # the connector is still finding out: ask on a later step
                self.connector_pending = True
                return
            self.waiting.popleft()
            if ext < 0:
                raise ProtocolError(f"connector reported {ext} external hit blocks")
            ext = min(ext, max_hits - len(hits))
            req.block_table = self.bm.allocate(hits, num_new)
            req.block_keys = keys
            req.num_computed_tokens = len(hits) * self.block_size
            req.num_committed_blocks = len(hits)
            req.prefill_end = req.num_tokens
            req.admissions += 1
            if req.admissions == 1:
                req.gpu_hit_blocks = len(hits)
                req.external_hit_blocks = ext
            if ext:
                span = slice(len(hits), len(hits) + ext)
                req.load = self.connector.start_load(req, keys[span], req.block_table[span])
                req.status = RequestStatus.LOADING
                self.loading.append(req)
            else:
                req.status = RequestStatus.RUNNING
                self.running.append(req)

    def _reserve_decode_pages(self) -> list[Request]:
        """Give each decoding request the page its next token needs, preempting if none."""
        scheduled: list[Request] = []
        queue = list(self.running)
        while queue and len(scheduled) < self.max_batch_size:
            req = queue.pop(0)
            need = self._blocks_for(req.num_tokens) - len(req.block_table)
            while not self.bm.can_allocate([], need):
                victim = queue.pop() if queue else req
                self._preempt(victim)
                if victim is req:
                    break
            else:
                req.block_table.extend(self.bm.allocate([], need))
                scheduled.append(req)
        return scheduled

    # -- transitions ---------------------------------------------------------------------

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.bm.free(req.block_table)
        req.block_table = []
        req.num_computed_tokens = 0
        req.num_committed_blocks = 0
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def _finish(self, req: Request) -> None:
        self.running.remove(req)
        req.status = RequestStatus.FINISHED
        if self.connector.request_finished(req, tuple(req.block_table)):
            self.held[req.request_id] = req
        else:
            self.bm.free(req.block_table)
            req.block_table = []

    def _commit_full_blocks(self, req: Request) -> None:
        full = req.num_computed_tokens // self.block_size
        if full <= req.num_committed_blocks:
            return
        if len(req.block_keys) < full:
            req.block_keys = self.hash_blocks(req.all_token_ids)
        span = range(req.num_committed_blocks, full)
        # Only newly named pages go to the connector: a page whose key another page
        # already holds stays unnamed, and is reused without on_gpu_evict.
        named = [i for i in span if self.bm.commit(req.block_table[i], req.block_keys[i])]
        req.num_committed_blocks = full
        if named:
            self.connector.on_blocks_full(
                req, [req.block_keys[i] for i in named], [req.block_table[i] for i in named]
            )

    # -- helpers -----------------------------------------------------------------------------

    def _keys_in_flight(self) -> set[BlockHash]:
        """Keys of full blocks that admitted requests will compute or load, not yet named."""
        keys: set[BlockHash] = set()
        for req in (*self.running, *self.loading):
            keys.update(req.block_keys[req.num_committed_blocks :])
        return keys

    def _batch(self, reqs: list[Request], end: int, is_prefill: bool) -> ScheduledBatch:
        return ScheduledBatch(tuple(reqs), tuple(self._input(r, end) for r in reqs), is_prefill)

    def _input(self, req: Request, end: int) -> SeqInput:
        start = req.num_computed_tokens
        return SeqInput(
            block_table=tuple(req.block_table),
            num_past=start,
            token_ids=tuple(req.all_token_ids[start:end]),
        )

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
