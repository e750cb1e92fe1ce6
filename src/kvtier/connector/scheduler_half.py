"""``ConnectorScheduler``: the connector's scheduler half. Pure Python, no torch.

Runs in the engine's scheduler process, called from its one scheduler thread. Per
request and per step it turns the engine's page keys into offloaded-block keys, asks
the manager (``lookup``, ``can_store``/``prepare_store``, ``can_promote``/
``prepare_promotion``, ``prepare_load``, ``touch``, completions) and emits the work as
``TransferJob`` values (``kvtier.jobs``) for the worker half, which answers with
``TransferResult`` values. It holds no tensor, no handler and no store.

Engine pages are ``P`` tokens; offloaded blocks are ``f`` pages (``block_size_factor``).
Offloaded block ``j`` of a request covers pages ``j*f .. j*f+f-1`` and is named by the
key of its last page (keys are prefix-chained, so that key names the whole prefix)::

    pages        0   1   2   3 | 4   5   6   7 | 8 ...        f = 4
    blocks       ---- j=0 ---- | ---- j=1 ---- |
    GPU hits     [0 1 2]                               g = 3 pages
    load         skip 3 of j=0 ──► pages 3..7          ends on a block boundary

A load may start inside a block (``skip_count``) and always ends on a block boundary.
The engine always recomputes the prompt's last token (its logits give the next one),
so the hit count never reaches past the page that holds it. A load or promotion that
fails means recompute: the load completes with the leading pages that did load.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.config import STORE_POLICIES
from kvtier.connector.stats import Counters, OffloadStats
from kvtier.jobs import JobKind, TransferJob, TransferResult
from kvtier.load_store_specs import GPULoadStoreSpec, LoadStoreSpec
from kvtier.scheduler.tiering import TieredManager, TierJob

DISCOVERY_WAIT_S = 0.2
"""Default longest wait of an admission for a shared tier's answer (a LAN round trip
is well under a millisecond; recomputing a long prefix costs far more than this)."""


@dataclass(frozen=True, slots=True)
class LoadDone:
    """A request's load finished: its first ``num_pages`` pages hold loaded bytes.

    Fewer pages than asked means a failure or a refusal; the engine recomputes the rest.
    """

    request_id: str
    num_pages: int


@dataclass(frozen=True, slots=True)
class Progress:
    """What finished jobs completed: loads, and finished requests whose pages the
    connector no longer reads."""

    loads: tuple[LoadDone, ...] = ()
    released: tuple[str, ...] = ()


@dataclass(slots=True)
class _Load:
    """One request's load: promotions first (if any), then one CPU->GPU job."""

    request_id: str
    num_pages: int
    block_keys: list[BlockHash]
    gpu_block_ids: tuple[BlockId, ...]
    skip: int
    # The blocks promoted into the CPU tier for this load, by the tier they came from:
    # a loaded block is a hit of that tier, any other a hit of the CPU tier.
    promoted_from: dict[BlockHash, Medium] = field(default_factory=dict)
    promotions: set[int] = field(default_factory=set)
    failed: int = 0  # blocks whose promotion failed


@dataclass(frozen=True, slots=True)
class _InFlight:
    """The scheduler half's memory of a job it emitted (never sent)."""

    kind: JobKind
    block_hashes: tuple[BlockHash, ...]
    request_id: str | None = None
    load: _Load | None = None
    tier_job: TierJob | None = None


class ConnectorScheduler:
    """The scheduler half over one manager.

    Args:
        manager: the tiering (a tiering with no secondary tier for CPU only).
        block_size_factor: engine pages per offloaded block (``f``).
        gpu_block_size: tokens per engine page (``P``).
        store_policy: ``"eager"``, ``"on_evict"`` or ``"reuse"`` (see
            ``docs/offloading.md``).
        discovery_wait_s: longest an admission waits (answering ``None``) for a
            shared tier to say whether it holds the request's next blocks; past it,
            they are misses. ``0``: never wait.
    """

    def __init__(
        self,
        manager: TieredManager,
        *,
        block_size_factor: int,
        gpu_block_size: int,
        store_policy: str = "eager",
        discovery_wait_s: float = DISCOVERY_WAIT_S,
    ) -> None:
        if store_policy not in STORE_POLICIES:
            raise ValueError(f"store_policy must be one of {STORE_POLICIES}, got {store_policy!r}")
        self.manager = manager
        self.f = block_size_factor
        self.page = gpu_block_size
        self.policy = store_policy
        self.discovery_wait_s = discovery_wait_s
        self._asked: dict[str, float] = {}  # request -> when (a) first answered None
        self._next_id = 0
        self._jobs: dict[int, _InFlight] = {}
        self._outbox: list[TransferJob] = []
        self._done_loads: list[LoadDone] = []  # loads completed without a job
        self._next_block: dict[str, int] = {}  # request -> first block not yet offered
        self._stores: dict[str, int] = {}  # request -> store jobs reading its pages
        self._loading: dict[str, int] = {}  # request -> loads (with promotions) in flight
        self._finished: set[str] = set()  # finished requests waiting for their jobs
        self._stats = Counters()

    # -- engine points -----------------------------------------------------------------

    def num_external_hit_pages(
        self,
        request_id: str,
        page_keys: Sequence[BlockHash],
        num_gpu_hit_pages: int,
        num_tokens: int,
    ) -> int | None:
        """(a) How many pages past the GPU hit are offloaded and worth loading.

        Never more than lets the engine recompute the last of ``num_tokens`` tokens,
        and the load ends on an offloaded-block boundary. ``None``: a shared tier is
        being asked about the next blocks (in the background); ask again on a later
        step. After ``discovery_wait_s`` the answer is given without them.
        """
        f, g = self.f, num_gpu_hit_pages
        keys = page_keys[f - 1 :: f]
        j0 = g // f
        asked_at = self._asked.get(request_id)
        if asked_at is None:
            # the whole request, then its use, in the order replay gives them: a policy
            # that learns (``density``, ``leader``) sees the prefix the GPU served and
            # measures a hit's age from before this use
            hit = self.manager.lookup(keys, j0)
            self.manager.touch(keys)
            self.manager.count_seen(keys[:j0])  # served by the GPU: a reuse
        else:  # asked before, waiting for a shared tier's answer
            hit = self.manager.lookup_known(keys[j0:])
        rest = keys[j0 + hit :]
        now = time.monotonic()
        if asked_at is None:
            asked_at = now
        if rest and now - asked_at < self.discovery_wait_s and self.manager.discovering(rest):
            self._asked[request_id] = asked_at
            return None
        self._asked.pop(request_id, None)
        self._next_block[request_id] = 0
        last_loadable = (num_tokens - 1) // self.page  # the page of the last token
        end = min((j0 + hit) * f, last_loadable // f * f)
        return max(0, end - g)

    def start_load(
        self,
        request_id: str,
        page_keys: Sequence[BlockHash],
        first_page: int,
        gpu_block_ids: Sequence[BlockId],
    ) -> None:
        """(b) Load pages ``first_page ..`` of the request into ``gpu_block_ids``.

        Emits promotion jobs, or the load job; a ``LoadDone`` for the request comes
        back from ``on_finished`` (or the next call of it, when nothing could load).
        """
        f, g = self.f, first_page
        j0, j1 = g // f, (g + len(gpu_block_ids)) // f
        load = _Load(
            request_id=request_id,
            num_pages=len(gpu_block_ids),
            block_keys=list(page_keys[f - 1 :: f][j0:j1]),
            gpu_block_ids=tuple(gpu_block_ids),
            skip=g - j0 * f,
        )
        self._loading[request_id] = self._loading.get(request_id, 0) + 1
        self._start_promotions(load)
        if not load.promotions:  # a request being loaded is not finished: none released
            self._submit_load(load, released=[])

    def pages_full(
        self,
        request_id: str,
        page_keys: Sequence[BlockHash],
        num_full_pages: int,
        block_table: Sequence[BlockId],
    ) -> None:
        """(c) The request's first ``num_full_pages`` pages are full: store the
        offloaded blocks they complete (``eager`` and ``reuse``)."""
        if self.policy == "on_evict":
            return
        f = self.f
        start, end = self._next_block.get(request_id, 0), num_full_pages // f
        if end <= start:
            return
        self._next_block[request_id] = end
        keys = page_keys[f - 1 :: f]
        gpu_of = {keys[j]: block_table[j * f : (j + 1) * f] for j in range(start, end)}
        self._store(list(gpu_of), gpu_of, request_id)

    def gpu_evict(self, page_key: BlockHash, gpu_block_id: BlockId) -> int | None:
        """(d) A cached page is about to be reused: with ``on_evict``, store it.

        Returns the store job's id, which must finish before the page is overwritten.
        """
        if self.policy != "on_evict":
            return None
        return self._store([page_key], {page_key: [gpu_block_id]}, None)

    def request_finished(self, request_id: str) -> bool:
        """(f) ``True``: jobs still use the request's pages -- stores read them, or its
        load (or a promotion before it) is still to write them, as when a request is
        aborted mid-load. Its id comes back in ``Progress.released`` once they are
        done, and its load's blocks are unpinned then as for any load."""
        self._next_block.pop(request_id, None)
        self._asked.pop(request_id, None)
        if self._stores.get(request_id) or self._loading.get(request_id):
            self._finished.add(request_id)
            return True
        return False

    # -- jobs ------------------------------------------------------------------------------

    def take_jobs(self, write_through: bool = True) -> list[TransferJob]:
        """The jobs emitted since the last call, for the worker half, in order.

        With ``write_through``, queued write-through jobs (CPU -> secondary tiers)
        are emitted too (once per engine step is enough).
        """
        if write_through:
            for tier_job in self.manager.prepare_writes():
                job = _InFlight(JobKind.WRITE, tier_job.block_hashes, tier_job=tier_job)
                self._emit(job, tier_job.src, tier_job.dst)
        jobs, self._outbox = self._outbox, []
        return jobs

    def on_finished(self, results: Iterable[TransferResult]) -> Progress:
        """Complete the jobs the worker half reported (in any order across kinds)."""
        released: list[str] = []
        for result in results:
            self._finish(self._jobs.pop(result.job_id), result, released)
        loads, self._done_loads = self._done_loads, []
        return Progress(tuple(loads), tuple(released))

    @property
    def jobs_in_flight(self) -> list[int]:
        """Ids of the jobs emitted and not yet reported finished."""
        return list(self._jobs)

    @property
    def has_pending_work(self) -> bool:
        """Whether anything is still to do: jobs in flight, jobs not yet taken,
        loads to report, or background work of the manager."""
        return bool(self._jobs or self._outbox or self._done_loads or self.manager.has_pending_work)

    def take_stats(self) -> OffloadStats:
        """Counters since the last call."""
        stats, self._stats = self._stats.freeze(), Counters()
        return stats

    def shutdown(self) -> None:
        """Stop the manager's background work."""
        self.manager.shutdown()

    # -- internals -------------------------------------------------------------------------

    def _store(
        self, keys: list[BlockHash], gpu_of: Mapping[BlockHash, Sequence[BlockId]], rid: str | None
    ) -> int | None:
        # Ask, then act: store the longest leading part that fits now (a prefix's head
        # is worth the most); each block that does not fit is refused once.
        n = self.manager.can_store(keys)
        self._stats.refused_stores += len(keys) - n
        if n == 0:
            return None
        out = self.manager.prepare_store(keys[:n])
        assert out is not None, "can_store promised room"
        if not out.block_hashes_to_store:
            return None  # all held already, or not admitted
        gpu_ids = [b for key in out.block_hashes_to_store for b in gpu_of[key]]
        job = _InFlight(JobKind.STORE, out.block_hashes_to_store, request_id=rid)
        if rid is not None:
            self._stores[rid] = self._stores.get(rid, 0) + 1
        return self._emit(job, GPULoadStoreSpec(tuple(gpu_ids)), out.store_spec)

    def _start_promotions(self, load: _Load) -> None:
        n = self.manager.can_promote(load.block_keys)
        if n == 0:  # the CPU tier cannot make room: load what it holds
            return
        tier_jobs = self.manager.prepare_promotion(load.block_keys[:n])
        assert tier_jobs is not None, "can_promote promised room"
        for tier_job in tier_jobs:
            load.promoted_from.update(dict.fromkeys(tier_job.block_hashes, tier_job.src.medium))
            job = _InFlight(JobKind.PROMOTE, tier_job.block_hashes, load=load, tier_job=tier_job)
            load.promotions.add(self._emit(job, tier_job.src, tier_job.dst))

    def _submit_load(self, load: _Load, released: list[str]) -> None:
        ready = self.manager.ready_run(load.block_keys)
        pages = min(ready * self.f - load.skip, load.num_pages) if ready else 0
        self._stats.refused_loads += max(0, len(load.block_keys) - ready - load.failed)
        if pages <= 0:
            self._load_done(LoadDone(load.request_id, 0), released)
            return
        keys = load.block_keys[:ready]
        cpu_spec = self.manager.prepare_load(keys)
        gpu_spec = GPULoadStoreSpec(load.gpu_block_ids[:pages], skip_count=load.skip)
        self._emit(_InFlight(JobKind.LOAD, tuple(keys), load=load), cpu_spec, gpu_spec)

    def _emit(self, job: _InFlight, src: LoadStoreSpec, dst: LoadStoreSpec) -> int:
        job_id, self._next_id = self._next_id, self._next_id + 1
        self._jobs[job_id] = job
        self._outbox.append(TransferJob(job_id, job.kind, src, dst))
        return job_id

    def _finish(self, job: _InFlight, result: TransferResult, released: list[str]) -> None:
        ok, n, s = result.success, len(job.block_hashes), self._stats
        if job.kind is JobKind.LOAD:
            assert job.load is not None
            self.manager.complete_load(job.block_hashes)
            load = job.load
            if ok:
                s.loaded_blocks += n
                s.bytes_loaded += result.bytes_moved
                # Only the loaded run counts, and each of its blocks once, by where it
                # was found: the CPU blocks before a promoted run may have been evicted
                # while the promotion ran, so the run can be shorter than what was
                # promoted.
                primary = self.manager.primary.medium
                served = Counter(load.promoted_from.get(k, primary) for k in job.block_hashes)
                for medium, count in served.items():
                    s.hit(medium, count)
                pages = min(n * self.f - load.skip, load.num_pages)
                self._load_done(LoadDone(load.request_id, pages), released)
            else:
                s.failed_loads += n
                self._load_done(LoadDone(load.request_id, 0), released)
        elif job.kind is JobKind.STORE:
            self.manager.complete_store(job.block_hashes, success=ok)
            if ok:
                s.stored_blocks += n
                s.bytes_stored += result.bytes_moved
            else:
                s.failed_stores += n
            if job.request_id is not None:
                self._store_done(job.request_id, released)
        elif job.kind is JobKind.PROMOTE:
            assert job.tier_job is not None and job.load is not None
            self.manager.complete_promotion(job.tier_job, ok)
            job.load.promotions.discard(result.job_id)
            if not ok:
                s.failed_loads += n
                job.load.failed += n
                for key in job.block_hashes:  # dropped from the CPU tier: never loaded
                    job.load.promoted_from.pop(key, None)
            if not job.load.promotions:
                self._submit_load(job.load, released)
        else:
            assert job.tier_job is not None
            self.manager.complete_write(job.tier_job, ok)

    def _load_done(self, done: LoadDone, released: list[str]) -> None:
        """A request's load is over (loaded, failed, or nothing to load); a finished
        request with no store left either is released."""
        self._done_loads.append(done)
        rid = done.request_id
        self._loading[rid] -= 1
        if not self._loading[rid]:
            del self._loading[rid]
            if rid in self._finished and not self._stores.get(rid):
                self._finished.discard(rid)
                released.append(rid)

    def _store_done(self, rid: str, released: list[str]) -> None:
        self._stores[rid] -= 1
        if not self._stores[rid]:
            del self._stores[rid]
            if rid in self._finished and not self._loading.get(rid):
                self._finished.discard(rid)
                released.append(rid)
