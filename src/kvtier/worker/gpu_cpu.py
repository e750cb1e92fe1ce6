"""GPU <-> CPU offloading: the host slab and one single-direction handler each way.

Runs in the worker process, in the engine's thread; copies run on a CUDA stream per
handler, or on one worker thread per handler when the "GPU" tensors are CPU tensors
(a machine without a GPU runs the same handlers, so every test runs everywhere).

Geometry (``f = cpu_block_size // gpu_block_size``; ``P`` = a GPU block's page, the
rows of every fragment of every layer, see ``kv_view``)::

    host slab: num_cpu_blocks rows of f * P bytes, viewed as num_cpu_blocks * f rows of P
    offloaded block c = sub-blocks c*f .. c*f+f-1, each laid out like one GPU page:
    | K layer 0 | V layer 0 | K layer 1 | ... |   (KV_FIRST; one fragment per tensor
                                                   for the other layouts)

so an offloaded block is one contiguous run of ``f * P`` bytes holding every layer,
which is what makes host-side copies large and what a disk tier writes as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from kvtier.blocks import Medium
from kvtier.errors import ConfigError, KvtierError, TransferSpecError
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.media.pinned import HostSlab
from kvtier.worker.blockmap import plan_rows
from kvtier.worker.handler import OffloadingHandler, TransferResult, TransferSpec
from kvtier.worker.kv_view import KVCacheView, KVLayout, kv_cache_view
from kvtier.worker.lanes import CudaLane, ThreadLane
from kvtier.worker.pagecopy import CudaPageCopier, HostPageCopier


class SingleDirectionHandler(OffloadingHandler):
    """GPU->CPU or CPU->GPU jobs, finished in submission order (see ``OffloadingHandler``).

    ``transfer_async`` validates the spec and plans the rows in the caller's thread
    (cheap: Python lists for jobs of up to ``blockmap.SMALL_JOB_ROWS``
    blocks, numpy above), then hands the copy to the lane. An invalid spec is
    refused (``False``) and reported failed, in order, by ``get_finished``.
    """

    def __init__(
        self,
        *,
        gpu_to_cpu: bool,
        copier: HostPageCopier | CudaPageCopier,
        lane: ThreadLane | CudaLane,
        block_size_factor: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
    ) -> None:
        self.gpu_to_cpu = gpu_to_cpu
        self.src_medium, self.dst_medium = (
            (Medium.GPU, Medium.CPU) if gpu_to_cpu else (Medium.CPU, Medium.GPU)
        )
        self._copier = copier
        self._lane = lane
        self._factor = block_size_factor
        self._num_gpu_blocks = num_gpu_blocks
        self._num_cpu_blocks = num_cpu_blocks
        self._shut = False

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Validate and submit; returns False (and reports the failure) when refused."""
        try:
            plan = self._plan(spec)
        except (KvtierError, TypeError, ValueError, OverflowError) as exc:  # Overflow: id > int64
            self._lane.submit(job_id, None, f"invalid transfer spec: {exc}")
            return False
        if self._shut:
            self._lane.submit(job_id, None, "handler is shut down")
            return False
        copier, gpu_to_cpu = self._copier, self.gpu_to_cpu
        self._lane.submit(job_id, lambda: copier.copy(plan, gpu_to_cpu))
        return True

    def _plan(self, spec: TransferSpec):  # type: ignore[no-untyped-def]
        src, dst = spec
        gpu, cpu = (src, dst) if self.gpu_to_cpu else (dst, src)
        if not isinstance(gpu, GPULoadStoreSpec) or not isinstance(cpu, CPULoadStoreSpec):
            raise TransferSpecError(
                f"{self.src_medium}->{self.dst_medium} needs "
                f"({self.src_medium} spec, {self.dst_medium} spec), got "
                f"({type(src).__name__}, {type(dst).__name__})"
            )
        return plan_rows(
            gpu,
            cpu,
            block_size_factor=self._factor,
            num_gpu_blocks=self._num_gpu_blocks,
            num_cpu_blocks=self._num_cpu_blocks,
            gpu_is_dst=not self.gpu_to_cpu,
        )

    def get_finished(self) -> list[TransferResult]:
        """Finished jobs, in submission order; never blocks, never raises for a job."""
        return self._lane.poll()

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs have finished."""
        self._lane.wait(job_ids)

    def shutdown(self) -> None:
        """Finish queued jobs, then refuse new ones."""
        self._shut = True
        self._lane.close()
        close = getattr(self._copier, "close", None)  # test doubles may have no close
        if close is not None:
            close()


class CpuGpuOffloadingHandlers:
    """The host slab for a group of GPU KV tensors, and a handler for each direction.

    Attributes:
        gpu_to_cpu_handler: stores (GPU blocks -> offloaded blocks).
        cpu_to_gpu_handler: loads (offloaded blocks -> GPU blocks).
        host_slab: the ``HostSlab`` of ``num_cpu_blocks`` offloaded blocks.
        kv_view: the canonical byte view of the GPU tensors.
        block_size_factor: ``cpu_block_size // gpu_block_size``.
    """

    def __init__(
        self,
        gpu_kv_caches: Sequence[torch.Tensor],
        gpu_block_size: int,
        cpu_block_size: int,
        num_cpu_blocks: int,
        layout: KVLayout | str = KVLayout.KV_FIRST,
        pin_memory: bool | None = None,
    ) -> None:
        """Build the slab and both handlers.

        Args:
            gpu_kv_caches: the engine's KV tensors, all on one device (one per layer
                for ``KV_FIRST``/``BLOCKS_FIRST``; cross-layer tensors otherwise).
            gpu_block_size: tokens per GPU block.
            cpu_block_size: tokens per offloaded block, a multiple of ``gpu_block_size``.
            num_cpu_blocks: offloaded blocks in the slab (see ``media.host_sizing``).
            layout: how to read the tensors (``kv_view.KVLayout``).
            pin_memory: pin the slab; default: when the tensors are on a CUDA device.

        Raises:
            ConfigError: naming the argument at fault.
        """
        for key, value in (
            ("gpu_block_size", gpu_block_size),
            ("cpu_block_size", cpu_block_size),
            ("num_cpu_blocks", num_cpu_blocks),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(key, f"must be a positive integer, got {value!r}")
        if cpu_block_size % gpu_block_size:
            raise ConfigError(
                "cpu_block_size",
                f"{cpu_block_size} is not a multiple of gpu_block_size {gpu_block_size}",
            )
        per_layer = KVLayout(layout) is not KVLayout.CROSS_LAYER
        self.kv_view: KVCacheView = kv_cache_view(
            gpu_kv_caches, layout, gpu_block_size if per_layer else None
        )
        devices = {f.device for f in self.kv_view.fragments}
        if len(devices) != 1:
            raise ConfigError("gpu_kv_caches", f"tensors span devices {sorted(map(str, devices))}")
        device = devices.pop()
        on_cuda = device.type == "cuda"
        if not on_cuda and device.type != "cpu":
            raise ConfigError("gpu_kv_caches", f"unsupported device {device}; use cuda or cpu")
        self.block_size_factor = cpu_block_size // gpu_block_size
        page = self.kv_view.page_bytes
        self.host_slab = HostSlab(
            num_cpu_blocks,
            page * self.block_size_factor,
            on_cuda if pin_memory is None else pin_memory,
        )
        slab_sub = self.host_slab.tensor.view(num_cpu_blocks * self.block_size_factor, page)
        copier_type = CudaPageCopier if on_cuda else HostPageCopier
        handlers = []
        for gpu_to_cpu in (True, False):
            name = "kvtier-gpu-to-cpu" if gpu_to_cpu else "kvtier-cpu-to-gpu"
            lane = CudaLane(device, wait_for_compute=gpu_to_cpu) if on_cuda else ThreadLane(name)
            handlers.append(
                SingleDirectionHandler(
                    gpu_to_cpu=gpu_to_cpu,
                    copier=copier_type(self.kv_view.fragments, slab_sub),
                    lane=lane,
                    block_size_factor=self.block_size_factor,
                    num_gpu_blocks=self.kv_view.num_blocks,
                    num_cpu_blocks=num_cpu_blocks,
                )
            )
        self.gpu_to_cpu_handler, self.cpu_to_gpu_handler = handlers

    def shutdown(self) -> None:
        """Shut both handlers down (queued jobs finish), then unpin the slab."""
        self.gpu_to_cpu_handler.shutdown()
        self.cpu_to_gpu_handler.shutdown()
        self.host_slab.close()
