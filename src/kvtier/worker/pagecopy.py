"""How one job's pages are copied between GPU fragments and the host slab.

Both copiers take a validated ``RowPlan`` and issue a few batched calls per job, never
one call per block per layer:

* ``HostPageCopier`` (both sides in host memory: the CPU stand-in). Where the
  extension is built (``rowcopy``), ONE call per job into the C row copier: every
  (row, fragment) moves straight from source row to destination row, one pass, no
  temporary, no Python per row; jobs of ``rowcopy.STREAM_MIN_BYTES`` (2 MiB) and more
  write with non-temporal stores. Every row is bounds-checked before anything is
  copied (a bad plan raises ``TransferSpecError``).

  The numpy fallback (the extension not built, or ``KVTIER_NATIVE_COPY=0``; ``kind``
  says which runs) moves the same bytes. Every fragment and the slab are also read as
  numpy arrays of *rows* (one ``void`` item per page or fragment, ``row_items``), so a
  gather or a scatter (fancy indexing) is one ``memcpy`` per row. Every call moves at
  most ``CHUNK_BYTES`` of one fragment, so the temporary numpy gathers into stays in
  cache.

  - Runs (the host rows of the job are long consecutive runs): per run, chunk and
    fragment, one call moves the rows between the fragment and the run's slab rows.
  - Scattered (average run under ``RUN_MIN_BYTES`` per call): per chunk of the job's
    rows (``CHUNK_BYTES`` of each fragment) and fragment, one numpy statement moves
    the rows between fragment and slab (``slab_col[c] = frag[g]`` for a store, the
    reverse for a load): numpy gathers into a chunk-sized temporary that stays in
    cache, then scatters it (two passes: no numpy or torch primitive copies scattered
    rows to scattered rows in one, which is why the C loop exists).
  - By row (every fragment at least ``ROW_COPY_MIN_BYTES``, 32 KiB): one
    ``np.copyto`` per fragment row, straight from source row to destination row,
    runs or not: large rows amortise the call, and cross the cache once.
* ``CudaPageCopier`` (GPU tensors and a pinned slab). A store gathers the job's rows of
  every fragment into a GPU staging buffer laid out exactly like the slab (one
  ``index_select`` per fragment, at HBM speed); a load does the reverse. Between the
  staging buffer and the slab: when the host rows form few long runs, one
  ``cudaMemcpyAsync`` per run straight to or from the slab; when they are scattered
  (many short runs), ONE copy per job through a pinned bounce buffer, gathered from
  the slab on the host before a load, scattered into the slab after a store
  (``finish``, run by the lane once the copy is done). Link transfers are therefore
  as large as the job, never per-page. The host side of that path (``SlabRows``)
  moves whole pages between the slab and the bounce buffer in one call of the C row
  copier, or with numpy where it is not built; it runs on CPU tensors too, so CPU
  tests check it.

Copies go through the widest word dtype that tiles the pages (``kv_view.word_dtype``)
on the GPU, and through whole rows on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvtier.errors import TransferSpecError
from kvtier.worker.blockmap import RowPlan
from kvtier.worker.kv_view import as_words, word_dtype
from kvtier.worker.rowcopy import RowRoute, check_rows, native_row_copier

RUN_MIN_BYTES = 64 * 1024
"""Average bytes per call below which scattered rows are copied chunk by chunk."""

MAX_DIRECT_RUNS = 2
"""Jobs with at most this many host runs always copy run by run (never staged)."""

CHUNK_BYTES = 256 * 1024
"""Bytes of one fragment's rows per call on the scattered path (the temporary numpy
gathers them into stays in L2)."""

ROW_COPY_MIN_BYTES = 32 * 1024
"""Fragments at least this large are copied one row at a time, straight from source
row to destination row (one pass, no temporary): a call's fixed cost (~1 us) is small
against the row's copy, and the bytes cross the cache once instead of twice."""


def slab_fragments(slab_sub: torch.Tensor, frag_bytes: Sequence[int]) -> list[torch.Tensor]:
    """Column views of ``slab_sub`` (``(sub_blocks, page_bytes)``), one per fragment."""
    views, offset = [], 0
    for nbytes in frag_bytes:
        views.append(slab_sub[:, offset : offset + nbytes])
        offset += nbytes
    return views


def row_items(view: torch.Tensor) -> np.ndarray:
    """A 2-D uint8 host tensor with contiguous rows as a 1-D numpy array of rows.

    Item ``i`` is row ``i`` as one opaque ``void`` value of ``shape[1]`` bytes, so
    numpy's gathers and scatters copy whole rows bitwise (no per-element work). Shares
    memory with ``view``.
    """
    if view.dtype != torch.uint8 or view.dim() != 2 or view.device.type != "cpu":
        raise ValueError("row_items needs a 2-D uint8 host tensor")
    rows, width = (int(n) for n in view.shape)
    if width > 1 and view.stride(1) != 1:
        raise ValueError("row_items needs contiguous rows")
    return np.asarray(_RowsInterface(view, rows, width))


class _RowsInterface:
    """Describes a tensor's rows to numpy (``__array_interface__``) and keeps it alive."""

    def __init__(self, view: torch.Tensor, rows: int, width: int) -> None:
        self.tensor = view
        self.__array_interface__ = {
            "version": 3,
            "shape": (rows,),
            "typestr": f"|V{width}",
            "data": (view.data_ptr(), False),
            "strides": (int(view.stride(0)) if rows > 1 else width,),
        }


def scattered(plan: RowPlan, bytes_per_row_call: int) -> bool:
    """Whether a job's host rows are too scattered to copy run by run.

    ``bytes_per_row_call``: bytes one call moves per row (a fragment's on the host
    path, a whole page on the CUDA path).
    """
    runs = plan.num_runs
    return runs > MAX_DIRECT_RUNS and len(plan) * bytes_per_row_call // runs < RUN_MIN_BYTES


class HostPageCopier:
    """Copies between host-resident fragments and the slab, in the calling thread.

    Attributes:
        kind: ``"native"`` (the C row copier, one call per job) or ``"numpy"``
            (the fallback: the extension not built, or ``KVTIER_NATIVE_COPY=0``).
    """

    def __init__(self, gpu_frags: Sequence[torch.Tensor], slab_sub: torch.Tensor) -> None:
        """Args: gpu_frags: ``(num_gpu_blocks, frag_bytes)`` uint8 views; slab_sub:
        ``(num_cpu_blocks * f, page_bytes)`` uint8 view of the slab."""
        frag_bytes = [int(f.shape[1]) for f in gpu_frags]
        cpu_frags = slab_fragments(slab_sub, frag_bytes)
        self._gpu_rows = min(int(f.shape[0]) for f in gpu_frags)
        self._cpu_rows = int(slab_sub.shape[0])
        native = native_row_copier()
        self.kind = "numpy" if native is None else "native"
        self._routes = None
        if native is not None:  # (store, load)
            self._routes = (
                native.route(gpu_frags, cpu_frags, ("GPU", "host")),
                native.route(cpu_frags, gpu_frags, ("host", "GPU")),
            )
        self._gpu = [row_items(f) for f in gpu_frags]
        self._cpu = [row_items(v) for v in cpu_frags]
        self._page_bytes = int(slab_sub.shape[1])
        self._frag_bytes = max(frag_bytes)
        self._by_row = min(frag_bytes) >= ROW_COPY_MIN_BYTES
        self._gpu_bytes = [f.numpy() for f in gpu_frags]  # 2-D uint8, for row copies
        self._cpu_bytes = [v.numpy() for v in cpu_frags]

    def copy(self, plan: RowPlan, gpu_to_cpu: bool) -> tuple[int, Any]:
        """Run the job now; returns ``(bytes moved, None)``."""
        n = len(plan)
        if n == 0:
            return 0, None
        if self._routes is not None:  # one call; the route checks every row first
            if gpu_to_cpu:
                self._routes[0].copy(plan.gpu_rows, plan.cpu_rows)
            else:
                self._routes[1].copy(plan.cpu_rows, plan.gpu_rows)
            return n * self._page_bytes, None
        check_rows(plan.gpu_rows, self._gpu_rows, "GPU")  # numpy would wrap a negative row
        check_rows(plan.cpu_rows, self._cpu_rows, "host")
        if self._by_row:
            self._copy_by_row(plan, gpu_to_cpu)
        elif scattered(plan, self._page_bytes // len(self._gpu)):
            self._copy_scattered(plan, gpu_to_cpu)
        else:
            self._copy_runs(plan, gpu_to_cpu)
        return n * self._page_bytes, None

    def _copy_by_row(self, plan: RowPlan, gpu_to_cpu: bool) -> None:
        copyto, frags = np.copyto, list(zip(self._gpu_bytes, self._cpu_bytes, strict=True))
        for g, c in zip(plan.gpu_rows.tolist(), plan.cpu_rows.tolist(), strict=True):
            for gpu, cpu in frags:
                if gpu_to_cpu:
                    copyto(cpu[c], gpu[g])
                else:
                    copyto(gpu[g], cpu[c])

    def close(self) -> None:
        """Nothing to release (the copier holds no thread)."""

    def _copy_runs(self, plan: RowPlan, gpu_to_cpu: bool) -> None:
        step = max(1, CHUNK_BYTES // self._frag_bytes)
        for start, first, length in plan.cpu_runs:
            for s in range(0, length, step):
                e = min(length, s + step)
                rows = plan.gpu_rows[start + s : start + e]
                for gpu, cpu in zip(self._gpu, self._cpu, strict=True):
                    if gpu_to_cpu:
                        cpu[first + s : first + e] = gpu[rows]
                    else:
                        gpu[rows] = cpu[first + s : first + e]

    def _copy_scattered(self, plan: RowPlan, gpu_to_cpu: bool) -> None:
        g, c = plan.gpu_rows, plan.cpu_rows
        step = max(1, CHUNK_BYTES // self._frag_bytes)
        for s in range(0, len(plan), step):
            gs, cs = g[s : s + step], c[s : s + step]
            for gpu, cpu in zip(self._gpu, self._cpu, strict=True):
                if gpu_to_cpu:
                    cpu[cs] = gpu[gs]
                else:
                    gpu[gs] = cpu[cs]


class SlabRows:
    """Whole pages between the slab and a contiguous host buffer, in the calling thread.

    The host side of ``CudaPageCopier``'s scattered path: ``scatter`` after a store's
    device-to-host copy into the bounce buffer, ``gather`` before a load's host-to-device
    copy from it. One call of the compiled row copier per job, through one route per
    direction built on first use and pointed at each job's own buffer for the call
    (``RowRoute.copy(through=...)``: building a route costs ~20-40 us), or numpy row
    items where the extension is not built. Rows are
    checked against the slab before anything is copied.

    Attributes:
        kind: ``"native"`` or ``"numpy"``, as ``HostPageCopier.kind``.
    """

    def __init__(self, slab_sub: torch.Tensor) -> None:
        """Args: slab_sub: ``(num_cpu_blocks * f, page_bytes)`` uint8 view of the slab."""
        self._slab = slab_sub
        self._items = row_items(slab_sub)
        self._native = native_row_copier()
        self.kind = "numpy" if self._native is None else "native"
        self._routes: dict[bool, RowRoute] = {}  # to_slab -> its route, built on first use
        # a route's own buffer side, between jobs: one row, never a freed job buffer
        self._idle = torch.zeros((1, int(slab_sub.shape[1])), dtype=torch.uint8)

    def scatter(self, buffer: torch.Tensor, cpu_rows: np.ndarray) -> None:
        """Copy ``buffer`` row ``i`` to slab row ``cpu_rows[i]``, for every ``i``.

        Raises:
            TransferSpecError: a row past the slab, or lengths that differ.
        """
        self._move(buffer, cpu_rows, to_slab=True)

    def gather(self, cpu_rows: np.ndarray, buffer: torch.Tensor) -> None:
        """Copy slab row ``cpu_rows[i]`` to ``buffer`` row ``i``, for every ``i``.

        Raises:
            TransferSpecError: a row past the slab, or lengths that differ.
        """
        self._move(buffer, cpu_rows, to_slab=False)

    def _move(self, buffer: torch.Tensor, cpu_rows: np.ndarray, to_slab: bool) -> None:
        n = len(cpu_rows)
        if int(buffer.shape[0]) != n:
            raise TransferSpecError(f"{n} slab rows for a buffer of {int(buffer.shape[0])}")
        if buffer.dim() != 2 or int(buffer.shape[1]) != int(self._slab.shape[1]):
            raise TransferSpecError(
                f"buffer rows of shape {tuple(buffer.shape)[1:]} for slab pages of "
                f"{int(self._slab.shape[1])} bytes"
            )
        if self._native is not None:
            own = np.arange(n, dtype=np.int64)
            route = self._routes.get(to_slab)
            if route is None:
                ends, names = ([self._idle], [self._slab]), ("buffer", "host")
                if not to_slab:
                    ends, names = ends[::-1], names[::-1]
                route = self._routes[to_slab] = self._native.route(*ends, names)
            if to_slab:
                route.copy(own, cpu_rows, through=(0, buffer))
            else:
                route.copy(cpu_rows, own, through=(1, buffer))
            return
        check_rows(np.asarray(cpu_rows, dtype=np.int64), len(self._items), "host")
        if to_slab:
            self._items[cpu_rows] = row_items(buffer)
        else:
            np.take(self._items, cpu_rows, out=row_items(buffer), mode="clip")  # checked


class CudaPageCopier:
    """Enqueues a job's copies on the current CUDA stream through a staging buffer."""

    def __init__(self, gpu_frags: Sequence[torch.Tensor], slab_sub: torch.Tensor) -> None:
        """Args as ``HostPageCopier``; ``gpu_frags`` on one CUDA device, slab pinned."""
        frag_bytes = [int(f.shape[1]) for f in gpu_frags]
        self._device = gpu_frags[0].device
        self._slab_sub = slab_sub
        self._slab_rows = SlabRows(slab_sub)
        self._frag_bytes = frag_bytes
        self._dtype = word_dtype(*gpu_frags, *slab_fragments(slab_sub, frag_bytes))
        self._gpu = [as_words(f, self._dtype) for f in gpu_frags]
        self._page_bytes = int(slab_sub.shape[1])

    def copy(self, plan: RowPlan, gpu_to_cpu: bool) -> tuple[int, Any]:
        """Enqueue the job; returns ``(bytes, what to keep until the stream is past it)``.

        With scattered host rows a store returns a ``Deferred`` whose ``finish``
        scatters the bounce buffer into the slab: the lane runs it once the copy is
        done, before it reports the job finished.
        """
        n = len(plan)
        if n == 0:
            return 0, None
        page = self._page_bytes
        rows = torch.from_numpy(plan.gpu_rows).to(self._device, non_blocking=True)
        staging = torch.empty((n, page), dtype=torch.uint8, device=self._device)
        staged = [as_words(v, self._dtype) for v in slab_fragments(staging, self._frag_bytes)]
        runs = plan.cpu_runs
        bounce = None
        if scattered(plan, page):
            bounce = torch.empty((n, page), dtype=torch.uint8, pin_memory=True)
        if gpu_to_cpu:
            for gpu, stage in zip(self._gpu, staged, strict=True):
                torch.index_select(gpu, 0, rows, out=stage)
            if bounce is not None:
                bounce.copy_(staging, non_blocking=True)  # one device-to-host copy per job
                slab, cpu_rows, done = self._slab_rows, plan.cpu_rows, bounce

                def finish() -> None:
                    slab.scatter(done, cpu_rows)

                return n * page, Deferred(keep=(rows, staging, bounce), finish=finish)
            for start, first, length in runs:
                self._slab_sub[first : first + length].copy_(
                    staging[start : start + length], non_blocking=True
                )
        else:
            if bounce is not None:  # the rows are READY: nothing writes them meanwhile
                self._slab_rows.gather(plan.cpu_rows, bounce)
                staging.copy_(bounce, non_blocking=True)  # one host-to-device copy per job
            else:
                for start, first, length in runs:
                    staging[start : start + length].copy_(
                        self._slab_sub[first : first + length], non_blocking=True
                    )
            for gpu, stage in zip(self._gpu, staged, strict=True):
                gpu.index_copy_(0, rows, stage)
        return n * page, (rows, staging, bounce)

    def close(self) -> None:
        """Nothing to release (the lane waits for the stream)."""


@dataclass(frozen=True, slots=True)
class Deferred:
    """A CUDA job's tensors to keep alive, and host work to run once its copies are done.

    Attributes:
        keep: tensors the stream still uses.
        finish: runs in the thread that polls the lane, after the job's end event,
            before the job is reported; an exception fails the job.
    """

    keep: Any
    finish: Callable[[], None]
