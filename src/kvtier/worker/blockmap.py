"""Which GPU block goes to which host sub-block: the index arithmetic of one job.

Runs on the host, in the caller's thread (pure numpy, no torch). An offloaded block of
``block_size`` tokens covers ``block_size_factor`` consecutive GPU-sized *sub-blocks*
of the host slab; offloaded block ``c`` owns sub-blocks ``c*f .. c*f+f-1``. A transfer
pairs GPU block ids, in token order, with those sub-blocks, in token order. It may
start in the middle of its first offloaded block (``skip_count``); it always ends at
the end of its last one::

    block_size_factor f = 4, cpu block ids [7, 2], skip_count = 1

    offloaded block      7                       2
    sub-block       28  29  30  31  |   8   9  10  11
                     ^skipped
    GPU block ids       g0  g1  g2  |  g3  g4  g5  g6      (7 = 2*4 - 1 GPU blocks)

The seed (vLLM's ``kv_offload`` CPU/GPU worker) uses the same rule for loads; kvtier
applies it to stores too, so a spec means the same thing in both directions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.errors import TransferSpecError
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec


def expand_block_ids(
    block_ids: Sequence[int] | np.ndarray, block_size_factor: int, skip_count: int = 0
) -> np.ndarray:
    """Sub-block ids covered by ``block_ids``, without the first ``skip_count``.

    Example: ``expand_block_ids([0, 1, 3], 4)`` is
    ``[0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]`` and
    ``expand_block_ids([0, 1, 3], 4, skip_count=3)`` is ``[3, 4, 5, 6, 7, 12, ...]``.

    Args:
        block_ids: offloaded block ids, in token order.
        block_size_factor: GPU blocks per offloaded block (>= 1).
        skip_count: sub-blocks of the first offloaded block left out,
            ``0 <= skip_count < block_size_factor`` (0 when ``block_ids`` is empty).

    Returns:
        A new 1-D ``int64`` array of ``len(block_ids) * f - skip_count`` ids.

    Raises:
        TransferSpecError: on a factor below 1 or a skip_count out of range.
    """
    if block_size_factor < 1:
        raise TransferSpecError(f"block_size_factor must be >= 1, got {block_size_factor}")
    ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
    limit = block_size_factor if len(ids) else 1
    if not 0 <= skip_count < limit:
        raise TransferSpecError(
            f"skip_count must be in 0..{limit - 1} for {len(ids)} offloaded blocks of "
            f"factor {block_size_factor}, got {skip_count}"
        )
    if block_size_factor == 1:
        return np.array(ids, dtype=np.int64)
    offsets = np.arange(block_size_factor, dtype=np.int64)
    return (ids[:, None] * block_size_factor + offsets).reshape(-1)[skip_count:]


@dataclass(frozen=True)
class RowPlan:
    """One validated job, as rows: GPU block ``gpu_rows[i]`` <-> host sub-block ``cpu_rows[i]``.

    Attributes:
        gpu_rows: GPU block ids (int64), in token order.
        cpu_rows: host sub-block ids (int64), same length.

    The runs of consecutive host sub-blocks (``run_starts``) are worked out on first
    use and kept: the compiled host copier never asks for them (it copies row by row
    in one call), the CUDA copier and the numpy fallback do. Not slotted, so that
    ``functools.cached_property`` can keep them.
    """

    gpu_rows: np.ndarray
    cpu_rows: np.ndarray

    @classmethod
    def pairing(cls, gpu_rows: np.ndarray, cpu_rows: np.ndarray) -> RowPlan:
        """The plan of already validated rows (int64 arrays of one length)."""
        return cls(gpu_rows, cpu_rows)

    @functools.cached_property
    def run_starts(self) -> np.ndarray:
        """Indices into the rows where ``cpu_rows`` stops being consecutive (int64,
        ``0`` first when there are rows): the job cut into runs of consecutive host
        sub-blocks. An array, so that a scattered job (one run per row) costs no
        Python object per row; ``cpu_runs`` spells the runs out."""
        cpu_rows = self.cpu_rows
        starts = np.empty(len(cpu_rows), dtype=bool)
        if len(starts):
            starts[0] = True
            np.not_equal(cpu_rows[1:] - cpu_rows[:-1], 1, out=starts[1:])
        return starts.nonzero()[0].astype(np.int64, copy=False)

    def __len__(self) -> int:
        return len(self.gpu_rows)

    @property
    def num_runs(self) -> int:
        """How many runs of consecutive host sub-blocks the job has."""
        return len(self.run_starts)

    @property
    def cpu_runs(self) -> tuple[tuple[int, int, int], ...]:
        """The runs as ``(first index into the rows, first host sub-block, length)``;
        a copy per run moves whole multi-layer pages (built on each call)."""
        if not len(self.cpu_rows):
            return ()
        ends = [*self.run_starts[1:].tolist(), len(self.cpu_rows)]
        firsts = self.cpu_rows[self.run_starts].tolist()
        return tuple(
            (s, first, e - s)
            for s, first, e in zip(self.run_starts.tolist(), firsts, ends, strict=True)
        )


def repeats(ids: np.ndarray) -> bool:
    """Whether an id occurs twice (a sort; ``np.unique`` costs several times more)."""
    ordered = np.sort(ids)
    return bool((ordered[1:] == ordered[:-1]).any())


SMALL_JOB_ROWS = 32
"""Jobs of at most this many GPU blocks are checked on Python lists, larger ones with
numpy: on a few dozen ids numpy's fixed cost per call (~1-2 us each, a dozen calls)
is most of the work, while ``min``, ``max`` and a ``set`` on a list cost a fraction
of a microsecond. ``plan_rows`` alone, list / numpy time: 16 blocks 0.64, 32 blocks
0.70-0.84, 64 blocks 0.85 with block_size_factor 4 but 1.17 with factor 1 (one
offloaded id per block: more Python per block), hence 32."""


def plan_rows(
    gpu_spec: GPULoadStoreSpec,
    cpu_spec: CPULoadStoreSpec,
    *,
    block_size_factor: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    gpu_is_dst: bool,
) -> RowPlan:
    """Validate a GPU<->CPU job and turn it into rows.

    Either way (``SMALL_JOB_ROWS``) the same checks run in the same order, with the
    same messages, before anything is built: the count, then every id against its
    side's limit (the first bad one named), then repeated destinations.

    Args:
        gpu_spec: GPU block ids and ``skip_count``.
        cpu_spec: offloaded block ids in the host slab.
        block_size_factor: GPU blocks per offloaded block.
        num_gpu_blocks: GPU blocks in the KV cache (ids must be below).
        num_cpu_blocks: offloaded blocks in the slab (ids must be below).
        gpu_is_dst: True for loads (CPU->GPU); the destination ids must be distinct.

    Raises:
        TransferSpecError: the message says which count or id is wrong.
    """
    gpu_rows = np.array(gpu_spec.block_ids, dtype=np.int64).reshape(-1)
    cpu_ids = np.array(cpu_spec.block_ids, dtype=np.int64).reshape(-1)
    expected = len(cpu_ids) * block_size_factor - gpu_spec.skip_count
    if len(gpu_rows) != expected:
        raise TransferSpecError(
            f"{len(cpu_ids)} offloaded blocks x factor {block_size_factor} - skip_count "
            f"{gpu_spec.skip_count} = {expected} GPU blocks expected, got {len(gpu_rows)}"
        )
    limits = (num_gpu_blocks, num_cpu_blocks)
    if len(gpu_rows) <= SMALL_JOB_ROWS:
        return _plan_small(
            gpu_rows, cpu_ids, block_size_factor, gpu_spec.skip_count, limits, gpu_is_dst
        )
    for name, ids, limit in (("GPU", gpu_rows, num_gpu_blocks), ("CPU", cpu_ids, num_cpu_blocks)):
        # read as unsigned, a negative id is above any limit: one pass finds both
        if len(ids) and ids.view(np.uint64).max() >= limit:
            bad = int(ids[(ids < 0) | (ids >= limit)][0])
            raise TransferSpecError(_out_of_range(name, bad, limit))
    cpu_rows = expand_block_ids(cpu_ids, block_size_factor, gpu_spec.skip_count)
    dst_name, dst = ("GPU", gpu_rows) if gpu_is_dst else ("CPU", cpu_rows)
    if repeats(dst):
        raise TransferSpecError(_repeat(dst_name, dst))
    return RowPlan.pairing(gpu_rows, cpu_rows)


def _plan_small(
    gpu_rows: np.ndarray,
    cpu_ids: np.ndarray,
    factor: int,
    skip: int,
    limits: tuple[int, int],
    gpu_is_dst: bool,
) -> RowPlan:
    """``plan_rows`` past the count check, on Python lists (``SMALL_JOB_ROWS``).

    Repeated CPU destinations are found among the offloaded ids, not the expanded
    rows: a repeated id repeats its last sub-block (which ``skip_count`` never drops),
    and distinct ids own disjoint sub-blocks.
    """
    gpu, cpu = gpu_rows.tolist(), cpu_ids.tolist()
    for name, ids, limit in (("GPU", gpu, limits[0]), ("CPU", cpu, limits[1])):
        if ids and (min(ids) < 0 or max(ids) >= limit):
            bad = next(b for b in ids if not 0 <= b < limit)
            raise TransferSpecError(_out_of_range(name, bad, limit))
    cpu_rows = expand_block_ids(cpu_ids, factor, skip) if factor != 1 or skip else cpu_ids
    dst = gpu if gpu_is_dst else cpu
    if len(set(dst)) != len(dst):
        name, rows = ("GPU", gpu_rows) if gpu_is_dst else ("CPU", cpu_rows)
        raise TransferSpecError(_repeat(name, rows))
    return RowPlan(gpu_rows, cpu_rows)


def _out_of_range(name: str, bad: int, limit: int) -> str:
    return f"{name} block id {bad} out of range 0..{limit - 1}"


def _repeat(name: str, rows: np.ndarray) -> str:
    return f"destination {name} blocks repeat in one job: {rows.tolist()}"
