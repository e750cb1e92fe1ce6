"""kvtier's ``OffloadingWorker`` for vLLM: one per rank, GPU pages <-> the CPU tier.

Runs in each vLLM worker process. vLLM hands the spec its KV caches as canonical
tensors (``(num_blocks, page_bytes)`` each); kvtier reads them as byte fragments
(``kv_view``, cross-layer layout) and copies whole pages between them and this rank's
slab of the shared region (``region``) with kvtier's page copiers: on CUDA through a
stream per direction, from the slab page-locked in place (``PageLock``); on vLLM's CPU
platform (host tensors standing in for GPU memory) on a thread per direction.
Offloaded block ``c`` is ``f`` consecutive page rows of the slab
(``f = blocks_per_chunk``), as in kvtier's own worker.

KV cache groups: vLLM's hybrid allocator gives every group its GPU blocks from one
pool, and GPU block ``b`` is row ``b`` of every canonical tensor whichever group holds
it (the groups' layers share the tensors; a Mamba group's state is padded to the same
page). A page row of the slab therefore holds one page of any group, and a job is its
groups' pages one group after another (``plan_job``).

Loads and stores run on separate lanes, and expedited loads (vLLM 0.33 waits for them
within the step) on a third, so they never queue behind regular loads.

Failures. vLLM asserts that every transfer succeeded. A store that fails (a copy
raised) is therefore reported as done to vLLM, and the block's status byte in the
region is set: the manager reads it in ``complete_store`` and drops the block, so it is
never served. A load can only fail through a bug or a device fault (its blocks were
verified and resident before vLLM was told they hit); the pages it wrote cannot be
trusted, so it is reported failed, and vLLM stops rather than compute from them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from kvtier.errors import ConfigError, ProtocolError
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.region import STORE_FAILED, STORE_OK
from kvtier.media.page_lock import PageLock
from kvtier.worker.blockmap import RowPlan, expand_block_ids, repeats
from kvtier.worker.kv_view import KVLayout, kv_cache_view
from kvtier.worker.lanes import CudaLane, ThreadLane
from kvtier.worker.pagecopy import CudaPageCopier, HostPageCopier

logger = logging.getLogger(__name__)


def plan_job(
    gpu_block_ids: np.ndarray,
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    cpu_block_ids: np.ndarray,
    *,
    factor: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    gpu_is_dst: bool,
) -> RowPlan:
    """Rows of one vLLM job: GPU block ``i`` <-> host page row ``rows[i]``.

    vLLM's rule, for each KV cache group in turn: the group's GPU blocks come next in
    ``gpu_block_ids`` (``group_sizes[g]`` of them), its offloaded blocks next in
    ``cpu_block_ids`` (as many as those GPU blocks need), and its first offloaded block
    may be entered ``block_indices[g] % factor`` pages in (a load that starts
    mid-request, as a sliding window's does), its last one left before its end::

        factor 2, group_sizes [3, 2], block_indices [0, 5], cpu ids [4, 9, 7, 3]

        group 0: GPU blocks g0 g1 g2 -> host rows  8  9 | 18    (offloaded blocks 4, 9)
        group 1: GPU blocks g3 g4    -> host rows 15 |  6       (blocks 7, 3, entered
                                                                 5 % 2 = 1 page in)

    A group with no GPU blocks takes no offloaded block.

    Raises:
        ProtocolError: counts or ids that do not fit.
    """
    gpu_rows = np.asarray(gpu_block_ids, dtype=np.int64).reshape(-1)
    cpu_ids = np.asarray(cpu_block_ids, dtype=np.int64).reshape(-1)
    if len(group_sizes) != len(block_indices) or sum(group_sizes) != len(gpu_rows):
        raise ProtocolError(
            f"group sizes {list(group_sizes)} and block indices {list(block_indices)} "
            f"do not describe {len(gpu_rows)} GPU blocks"
        )
    parts: list[np.ndarray] = []
    taken = 0
    for size, index in zip(group_sizes, block_indices, strict=True):
        if size == 0:
            continue
        skip = index % factor
        count = -(-(size + skip) // factor)  # offloaded blocks the group's pages span
        ids = cpu_ids[taken : taken + count]
        if len(ids) < count:
            break
        parts.append(expand_block_ids(ids, factor, skip)[:size])
        taken += count
    if taken != len(cpu_ids) or sum(map(len, parts)) != len(gpu_rows):
        raise ProtocolError(
            f"{len(gpu_rows)} GPU blocks in groups of {list(group_sizes)} entered "
            f"{[i % factor for i in block_indices]} pages in do not fill "
            f"{len(cpu_ids)} offloaded blocks of {factor} pages"
        )
    cpu_rows = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    for name, ids, limit in (("GPU", gpu_rows, num_gpu_blocks), ("CPU", cpu_ids, num_cpu_blocks)):
        if len(ids) and (ids.min() < 0 or ids.max() >= limit):
            raise ProtocolError(f"{name} block id out of range 0..{limit - 1}: {ids.tolist()}")
    dst = gpu_rows if gpu_is_dst else cpu_rows
    if repeats(dst):
        raise ProtocolError("a job writes one block twice")
    return RowPlan.pairing(gpu_rows, cpu_rows)


def canonical_fragments(kv_caches: Any) -> list[torch.Tensor]:
    """vLLM's canonical KV tensors as ``(num_blocks, page_bytes)`` uint8 views.

    Raises:
        ConfigError: (key ``kv_caches``) a tensor that is not one page per row
            (vLLM's packed layouts), or no tensor at all.
    """
    tensors = [t.tensor for t in kv_caches.tensors]
    if not tensors:
        raise ConfigError("kv_caches", "vLLM passed no KV cache tensors")
    out = []
    for i, t in enumerate(tensors):
        if t.dim() != 2 or not t.is_contiguous():
            raise ConfigError(
                "kv_caches",
                f"tensor {i} has shape {tuple(t.shape)} and strides {t.stride()}: kvtier "
                "copies whole pages of (num_blocks, page_bytes) tensors (no packed layouts)",
            )
        out.append(t.view(torch.uint8))
    return out


class KvtierWorker(compat.OffloadingWorker):  # type: ignore[misc]
    """Copies between this rank's KV caches and its slab; see the module doc.

    Args:
        kv_caches: vLLM's ``CanonicalKVCaches``.
        slab: this rank's slab, ``(num_cpu_blocks, shard_bytes)`` uint8 (CPU).
        status: this rank's status bytes, ``(num_cpu_blocks,)`` uint8.
        blocks_per_chunk: GPU pages per offloaded block.
    """

    def __init__(
        self, kv_caches: Any, slab: np.ndarray, status: np.ndarray, blocks_per_chunk: int
    ) -> None:
        view = kv_cache_view(canonical_fragments(kv_caches), KVLayout.CROSS_LAYER)
        f = blocks_per_chunk
        page = view.page_bytes
        if page * f != slab.shape[1]:
            raise ConfigError(
                "kv_caches",
                f"an offloaded block of {f} pages of {page} bytes is not the region's "
                f"{slab.shape[1]}-byte shard (vLLM's worker_kv_bytes_per_block disagrees "
                "with its KV cache tensors)",
            )
        self._factor = f
        self._num_gpu_blocks = view.num_blocks
        self._num_cpu_blocks = int(slab.shape[0])
        self._status = status
        rows = torch.from_numpy(slab).view(self._num_cpu_blocks * f, page)
        device = view.fragments[0].device
        on_cuda = device.type == "cuda"
        # On CUDA this rank's slab of the shared region is page-locked, so its copies
        # run as DMA on the lanes' own streams, overlapping the step.
        self._page_lock = PageLock(rows) if on_cuda else None
        copier_type = CudaPageCopier if on_cuda else HostPageCopier
        self._lanes: dict[str, ThreadLane | CudaLane] = {}
        self._copiers: dict[str, HostPageCopier | CudaPageCopier] = {}
        for name in ("store", "load", "expedited"):
            lane = (
                CudaLane(device, wait_for_compute=True)
                if on_cuda
                else ThreadLane(f"kvtier-vllm-{name}")
            )
            self._lanes[name] = lane
            self._copiers[name] = copier_type(view.fragments, rows)
        self._stores: set[int] = set()
        self._store_rows: dict[int, np.ndarray] = {}

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """GPU pages -> CPU tier; never blocks on the copy; always accepted."""
        cpu_ids = np.asarray(dst_spec.block_ids, dtype=np.int64)
        self._stores.add(job_id)
        self._store_rows[job_id] = cpu_ids
        self._submit("store", job_id, src_spec, cpu_ids, gpu_is_dst=False)
        return True

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        """CPU tier -> GPU pages; never blocks on the copy; always accepted."""
        cpu_ids = np.asarray(src_spec.block_ids, dtype=np.int64)
        self._submit("expedited" if expedited else "load", job_id, dst_spec, cpu_ids, True)
        return True

    def _submit(
        self, lane: str, job_id: int, gpu_spec: Any, cpu_ids: np.ndarray, gpu_is_dst: bool
    ) -> None:
        try:
            sizes = [int(n) for n in gpu_spec.group_sizes]
            indices = [int(i) for i in gpu_spec.block_indices]
            plan = plan_job(
                np.asarray(gpu_spec.block_ids),
                sizes,
                indices,
                cpu_ids,
                factor=self._factor,
                num_gpu_blocks=self._num_gpu_blocks,
                num_cpu_blocks=self._num_cpu_blocks,
                gpu_is_dst=gpu_is_dst,
            )
        except (ProtocolError, TypeError, ValueError) as exc:
            self._lanes[lane].submit(job_id, None, f"invalid transfer spec: {exc}")
            return
        copier = self._copiers[lane]
        self._lanes[lane].submit(job_id, lambda: copier.copy(plan, not gpu_is_dst))

    def get_finished(self) -> list[Any]:
        """Finished jobs as vLLM's ``TransferResult``s (see the module doc on failures)."""
        out = []
        for lane in self._lanes.values():
            for r in lane.poll():
                success = r.success
                if r.job_id in self._stores:
                    self._stores.discard(r.job_id)
                    rows = self._store_rows.pop(r.job_id)
                    self._status[rows] = STORE_OK if r.success else STORE_FAILED
                    if not r.success:
                        logger.error(
                            "kvtier: store job %d failed (%s); its blocks are dropped",
                            r.job_id,
                            r.error,
                        )
                        success = True  # vLLM cannot take a failure; the manager drops them
                elif not r.success:
                    logger.error("kvtier: load job %d failed: %s", r.job_id, r.error)
                out.append(
                    compat.TransferResult(
                        job_id=r.job_id,
                        success=success,
                        transfer_size=r.bytes_moved,
                        transfer_time=r.seconds,
                    )
                )
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        ids = list(job_ids)
        for lane in self._lanes.values():
            lane.wait(ids)

    def shutdown(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        if self._page_lock is not None:
            self._page_lock.release()
