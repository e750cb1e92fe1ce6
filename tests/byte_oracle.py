"""A byte oracle for end-to-end tests: every page loaded is the page that was stored.

Test-only, and independent of the media's own checks (block format, CRC, verification).
``install_recorder(llm)`` wraps the connector's worker half in a ``RecordingWorker``,
which sees only the values that cross between the halves (``TransferJob`` going out,
``TransferResult`` coming back) and the engine's KV pages:

* when a store leaves the GPU (``GPU -> CPU`` job submitted: the engine keeps those
  pages unchanged until the job finishes), it takes a SHA-256 of each GPU page, over
  every layer's K and V, and, once the job reports success, remembers them as what the
  CPU slots hold;
* jobs between tiers (``CPU -> DISK``/``REMOTE`` write-through, ``DISK``/``REMOTE ->
  CPU`` promotion) carry those digests along, by slot for the CPU and by block key for
  a persistent tier -- only on success; a failed job leaves its destination unknown;
* when a load into the GPU (``CPU -> GPU``) reports success, before the engine sees it,
  it digests the destination pages again and compares them with what the source slots
  should hold. A difference, or a load from a slot whose bytes it never saw stored, is
  a mismatch.

A test asserts ``recorder.mismatches == []`` and the exact number of pages checked,
so a load that serves other bytes fails the test even when the greedy tokens match,
and a recorder that checked nothing cannot pass for one that checked everything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvtier.blocks import BlockHash, Medium
from kvtier.jobs import TransferJob, TransferResult
from kvtier.load_store_specs import GPULoadStoreSpec, KeyedBlocksSpec

Digests = tuple[bytes | None, ...]  # one per GPU page of an offloaded block; None: unknown


@dataclass
class ByteRecorder:
    """What each CPU slot and each persistent key should hold, and what loads got."""

    kv_caches: Sequence[torch.Tensor]
    block_size_factor: int
    cpu: dict[int, Digests] = field(default_factory=dict)
    keyed: dict[tuple[Medium, BlockHash], Digests] = field(default_factory=dict)
    pending: dict[int, tuple[Any, Any, list[Digests]]] = field(default_factory=dict)
    pages_stored: int = 0
    pages_checked: int = 0
    loads_checked: int = 0
    mismatches: list[str] = field(default_factory=list)

    def page_digest(self, page: int) -> bytes:
        h = hashlib.sha256()
        for t in self.kv_caches:  # (2, num_blocks, block_size, heads, head_dim)
            h.update(t[:, page].contiguous().cpu().numpy().tobytes())
        return h.digest()

    def _blocks_of_pages(self, spec: GPULoadStoreSpec, n_blocks: int) -> list[list[int | None]]:
        """GPU page ids per offloaded block, ``None`` for pages skipped at the start."""
        f = self.block_size_factor
        pages: list[int | None] = [None] * spec.skip_count + list(spec.block_ids)
        assert len(pages) == n_blocks * f, (spec, n_blocks)
        return [pages[i * f : (i + 1) * f] for i in range(n_blocks)]

    def _held(self, spec: Any) -> list[Digests]:
        f = self.block_size_factor
        unknown: Digests = (None,) * f
        if spec.medium is Medium.CPU:
            return [self.cpu.get(slot, unknown) for slot in spec.block_ids]
        assert isinstance(spec, KeyedBlocksSpec)
        return [self.keyed.get((spec.medium, key), unknown) for key in spec.block_hashes]

    def submitted(self, job_id: int, transfer: tuple[Any, Any]) -> None:
        src, dst = transfer
        if src.medium is Medium.GPU:
            blocks = self._blocks_of_pages(src, len(dst.block_ids))
            digests = [
                tuple(None if p is None else self.page_digest(p) for p in pages) for pages in blocks
            ]
        elif dst.medium is Medium.GPU:
            digests = []  # checked when the load reports success
        else:
            digests = self._held(src)
        self.pending[job_id] = (src, dst, digests)

    def finished(self, job_id: int, success: bool) -> None:
        src, dst, digests = self.pending.pop(job_id)
        f = self.block_size_factor
        if dst.medium is Medium.GPU:
            if success:
                self._check_load(src, dst)
            return
        # A failed store leaves its destination unknown; a good one holds the digests.
        if not success:
            digests = [(None,) * f] * len(dst.block_ids)
        if dst.medium is Medium.CPU:
            for slot, d in zip(dst.block_ids, digests, strict=True):
                self.cpu[slot] = d
        else:
            assert isinstance(dst, KeyedBlocksSpec)
            for key, d in zip(dst.block_hashes, digests, strict=True):
                self.keyed[dst.medium, key] = d
        if success and src.medium is Medium.GPU:
            self.pages_stored += sum(p is not None for d in digests for p in d)

    def _check_load(self, src: Any, dst: GPULoadStoreSpec) -> None:
        self.loads_checked += 1
        want = self._held(src)
        for pages, expected in zip(self._blocks_of_pages(dst, len(want)), want, strict=True):
            for page, digest in zip(pages, expected, strict=True):
                if page is None:
                    continue
                self.pages_checked += 1
                if digest is None:
                    self.mismatches.append(f"page {page} loaded from {src}: never stored")
                elif self.page_digest(page) != digest:
                    self.mismatches.append(f"page {page} loaded from {src}: other bytes")


class RecordingWorker:
    """A worker half (``kvtier.connector.worker_half.WorkerHalf``) that tells a
    ``ByteRecorder`` about every job it is given and every result it reports."""

    def __init__(self, inner: Any, recorder: ByteRecorder) -> None:
        self.inner = inner
        self.recorder = recorder

    def submit(self, jobs: Sequence[TransferJob]) -> None:
        for job in jobs:
            self.recorder.submitted(job.job_id, job.spec)
        self.inner.submit(jobs)

    def get_finished(self) -> list[TransferResult]:
        results = self.inner.get_finished()
        for result in results:
            self.recorder.finished(result.job_id, result.success)
        return list(results)

    def wait(self, job_ids: Iterable[int]) -> None:
        self.inner.wait(job_ids)

    def shutdown(self) -> None:
        self.inner.shutdown()


def install_recorder(llm: Any, carry: ByteRecorder | None = None) -> ByteRecorder:
    """Wrap ``llm``'s offloading worker (before its first request) and return the recorder.

    ``carry``: a recorder of an earlier engine over the same persistent tiers; what it
    knew they hold (by block key) is known to this one. The one place that knows where
    the engine keeps its worker half.
    """
    connector = llm.connector
    recorder = ByteRecorder(llm.pool.kv_caches, connector.spec.block_size_factor)
    if carry is not None:
        recorder.keyed.update(carry.keyed)
    connector.worker = RecordingWorker(connector.worker, recorder)
    return recorder
