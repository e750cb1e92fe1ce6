"""``kvtier bench transfer``: GPU<->CPU handler bandwidth against a plain copy.

Runs on the machine's GPU when there is one, else on CPU tensors standing in for GPU
memory (the handlers' CPU path against a plain ``memcpy``-like ``copy_``). For each
page size and job size it times, after warm-up, the median of ``repeats`` runs of:

* ``plain``: one contiguous copy of the job's bytes (on a GPU: one pinned-buffer
  ``cudaMemcpyAsync``), the practical peak; on CPU torch runs it on all its threads
  (``torch_threads`` in the machine record);
* ``plain1`` (CPU only): the same copy on one thread, as the handler's copy runs;
* ``gather`` (CPU only): the bare gather of the store job's scattered rows of every
  fragment into one contiguous buffer, with the fastest host primitive measured
  (``np.take(mode="clip")`` straight into the buffer: one pass, no temporary): the
  floor of reading the same scattered rows, which a plain copy never pays;
* ``g2c`` / ``c2g``: one handler job, submit to finished, end to end;
* ``both``: a store and a load of the same size submitted together (bytes of both).

A *page* is one fragment: the K (or V) bytes of one layer for one GPU block (layout
``KV_FIRST``), so a block moves ``2 * layers * page`` bytes. ``ids`` says how the
offloaded block ids of a job are laid out in the slab: ``contiguous`` (a fresh tier)
or ``random`` (a fragmented one, the worst case). GPU block ids are always random.
Results go to ``kvtier-results/transfer-<host>-<time>.json`` (or ``--json PATH``);
on CPU ``config.host_copier`` says which host copier ran: ``native`` (the compiled
row copier) or ``numpy`` (its fallback; ``KVTIER_NATIVE_COPY=0`` forces it).
Torch only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from kvtier import options
from kvtier.blocks import BlockId
from kvtier.errors import ConfigError
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.results import (
    add_json_option,
    check_output,
    default_path,
    git_commit,
    machine_info,
    write_result,
)
from kvtier.worker import CpuGpuOffloadingHandlers, KVLayout
from kvtier.worker.gpu_cpu import SingleDirectionHandler
from kvtier.worker.pagecopy import row_items
from kvtier.worker.rowcopy import native_row_copier

KiB, MiB = 1024, 1024 * 1024
DEFAULT_PAGES = (8 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
DEFAULT_BLOCKS = (1, 16, 256, 4096)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(
    fns: dict[str, Callable[[], float | None]], device: torch.device, warmup: int, repeats: int
) -> dict[str, tuple[float, float | None]]:
    """Median wall seconds of each fn, and median of the lane seconds it returns (if any).

    The fns run round-robin, so a noisy neighbour slows every variant alike.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    walls: dict[str, list[float]] = {k: [] for k in fns}
    lanes: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            lane = fn()
            _sync(device)
            walls[name].append(time.perf_counter() - start)
            if lane is not None:
                lanes[name].append(lane)
    return {
        k: (statistics.median(walls[k]), statistics.median(lanes[k]) if lanes[k] else None)
        for k in fns
    }


def _run_jobs(jobs: Sequence[tuple[SingleDirectionHandler, tuple[Any, Any]]]) -> float:
    """Submit all, wait for all; returns the longest lane time (the jobs' copy time)."""
    for i, (handler, spec) in enumerate(jobs):
        handler.transfer_async(i, spec)
    lane = 0.0
    for i, (handler, _) in enumerate(jobs):
        handler.wait([i])
        for result in handler.get_finished():
            if not result.success:
                raise RuntimeError(f"benchmark job failed: {result.error}")
            lane = max(lane, result.seconds)
    return lane


def _one_case(
    page: int,
    blocks: int,
    layers: int,
    ids: str,
    device: torch.device,
    warmup: int,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    # fp16 pages of 16 tokens x 1 head x (page / 32) dims: exactly ``page`` bytes each.
    kv = [
        torch.empty((2, 2 * blocks, 16, 1, page // 32), dtype=torch.float16, device=device)
        for _ in range(layers)
    ]
    for t in kv:
        t.view(torch.int16).random_(-(2**15), 2**15 - 1)
    handlers = CpuGpuOffloadingHandlers(kv, 16, 16, 2 * blocks, KVLayout.KV_FIRST)
    # Touch the slab: never-written pages all map the zero page, and loads from them
    # would read one cache-hot page instead of memory.
    handlers.host_slab.tensor.fill_(1)
    nbytes = blocks * handlers.kv_view.page_bytes
    gpu_ids = torch.randperm(2 * blocks, generator=gen).tolist()
    cpu_ids = (
        torch.randperm(2 * blocks, generator=gen).tolist()
        if ids == "random"
        else list(range(2 * blocks))
    )
    g_ids = tuple(BlockId(int(b)) for b in gpu_ids)
    c_ids = tuple(BlockId(int(b)) for b in cpu_ids)
    store = (GPULoadStoreSpec(g_ids[:blocks]), CPULoadStoreSpec(c_ids[:blocks]))
    load = (CPULoadStoreSpec(c_ids[blocks:]), GPULoadStoreSpec(g_ids[blocks:]))
    g2c, c2g = handlers.gpu_to_cpu_handler, handlers.cpu_to_gpu_handler
    pin = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    host.fill_(1)  # fault every page in: untouched memory reads as one cache-hot zero page
    dev.fill_(2)

    def plain() -> None:
        host.copy_(dev, non_blocking=True)

    fns: dict[str, Callable[[], float | None]] = {"plain": plain}
    if device.type == "cpu":
        fns["plain1"] = lambda: _one_thread(plain)
        fns["gather"] = _gather(handlers.kv_view.fragments, gpu_ids[:blocks], host)
    fns["g2c"] = lambda: _run_jobs([(g2c, store)])
    fns["c2g"] = lambda: _run_jobs([(c2g, load)])
    fns["both"] = lambda: _run_jobs([(g2c, store), (c2g, load)])
    measured = _measure(fns, device, warmup, repeats)
    handlers.shutdown()
    seconds = {k: wall for k, (wall, _) in measured.items()}
    lane = {k: t for k, (_, t) in measured.items() if t is not None}
    gbps = {k: (2 if k == "both" else 1) * nbytes / s / 1e9 for k, s in seconds.items()}
    lane_gbps = {k: (2 if k == "both" else 1) * nbytes / t / 1e9 for k, t in lane.items() if t}
    jobs = ("g2c", "c2g", "both")
    refs = [r for r in ("plain1", "gather") if r in gbps]
    return {
        "page_bytes": page,
        "blocks": blocks,
        "ids": ids,
        "job_bytes": nbytes,
        "fragments": 2 * layers,
        "seconds": seconds,
        "lane_seconds": lane,
        "gbps": gbps,
        "lane_gbps": lane_gbps,
        "lane_ratio": {k: v / gbps["plain"] for k, v in lane_gbps.items()},
        "ratio": {k: gbps[k] / gbps["plain"] for k in jobs},
        **{f"ratio_{r}": {k: gbps[k] / gbps[r] for k in jobs} for r in refs},
    }


def _one_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` with torch on one thread (the handler's copy runs on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fn()
    finally:
        torch.set_num_threads(threads)


def _gather(
    fragments: Sequence[torch.Tensor], rows: Sequence[int], out: torch.Tensor
) -> Callable[[], None]:
    """The bare gather of ``rows`` of every fragment into ``out`` (host tensors)."""
    index = np.asarray(rows, dtype=np.int64)
    srcs = [row_items(f) for f in fragments]
    dsts = [row_items(part) for part in out.view(len(fragments), len(index), -1)]

    def gather() -> None:
        for src, dst in zip(srcs, dsts, strict=True):
            np.take(src, index, out=dst, mode="clip")

    return gather


def device_info(device: torch.device) -> dict[str, Any]:
    """This machine (``report.machine_info``) plus the device and torch's threads."""
    info = machine_info()
    info["device"] = str(device)
    info["torch_threads"] = torch.get_num_threads()
    return info


def run_transfer_bench(
    pages: Sequence[int] = DEFAULT_PAGES,
    blocks: Sequence[int] = DEFAULT_BLOCKS,
    *,
    layers: int = 2,
    ids: Sequence[str] = ("contiguous", "random"),
    max_job_bytes: int = 128 * MiB,
    warmup: int = 1,
    repeats: int = 5,
    device: str = "auto",
    seed: int = 0,
) -> dict[str, Any]:
    """Run the grid and return the results dict (what ``main`` writes as JSON).

    Cases whose job would exceed ``max_job_bytes`` are skipped and listed.
    """
    dev = torch.device(
        "cuda"
        if device == "auto" and torch.cuda.is_available()
        else (device if device != "auto" else "cpu")
    )
    if any(p % 32 or p <= 0 for p in pages):
        raise ConfigError("pages", f"page sizes must be positive multiples of 32, got {pages}")
    torch.manual_seed(seed)
    cases, skipped = [], []
    for page in pages:
        for n in blocks:
            if n * page * 2 * layers > max_job_bytes:
                skipped.append({"page_bytes": page, "blocks": n})
                continue
            for order in ids:
                cases.append(_one_case(page, n, layers, order, dev, warmup, repeats, seed))
    config = {
        "pages": list(pages),
        "blocks": list(blocks),
        "layers": layers,
        "ids": list(ids),
        "max_job_bytes": max_job_bytes,
        "warmup": warmup,
        "repeats": repeats,
        "seed": seed,
        "layout": "kv_first",
        "dtype": "float16",
        "block_size_factor": 1,
    }
    if dev.type == "cpu":  # what every HostPageCopier of the run chose
        config["host_copier"] = "numpy" if native_row_copier() is None else "native"
    return {
        "benchmark": "transfer",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": device_info(dev),
        "commit": git_commit(),
        "config": config,
        "cases": cases,
        "skipped": skipped,
        "summary": summarize(cases),
    }


def summarize(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median ratios to the plain copy per page size, over jobs of 16 blocks or more.

    ``wall``: submit to finished; ``lane``: the copy alone (no validation, no hand-off);
    on CPU also ``ratio_plain1`` and ``ratio_gather``: wall against the one-thread
    plain copy and against the bare gather of the same rows.
    """
    out: dict[str, Any] = {}
    for page in sorted({c["page_bytes"] for c in cases}):
        group = [c for c in cases if c["page_bytes"] == page and c["blocks"] >= 16] or [
            c for c in cases if c["page_bytes"] == page
        ]
        kinds = [("wall", "ratio"), ("lane", "lane_ratio")]
        kinds += [(key, key) for key in ("ratio_plain1", "ratio_gather") if key in group[0]]
        out[_size(page)] = {
            kind: {
                k: round(statistics.median(c[key][k] for c in group), 3)
                for k in ("g2c", "c2g", "both")
            }
            for kind, key in kinds
        }
    return out


def _size(n: int) -> str:
    return f"{n // MiB}MiB" if n >= MiB else f"{n // KiB}KiB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench transfer`` (each checked before anything is measured)."""
    parser.add_argument(
        "--pages",
        type=options.size_list,
        default="8KiB,16KiB,64KiB,256KiB,1MiB,4MiB",
        help="page sizes (one fragment), multiples of 32 bytes",
    )
    parser.add_argument(
        "--blocks", type=options.positive_list, default="1,16,256,4096", help="blocks per job"
    )
    parser.add_argument(
        "--layers", type=options.positive, default=2, help="layers (2 fragments each)"
    )
    parser.add_argument(
        "--ids", default="contiguous,random", help="slab id orders to run: contiguous, random"
    )
    parser.add_argument(
        "--max-job-mib", type=options.positive, default=128, help="skip larger jobs (MiB)"
    )
    parser.add_argument(
        "--repeats", type=options.positive, default=5, help="timed runs per case (median)"
    )
    parser.add_argument(
        "--warmup", type=options.non_negative, default=1, help="untimed runs per case first"
    )
    parser.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where the KV cache lives (auto: cuda if available)",
    )
    add_json_option(parser, "transfer")


def main(args: argparse.Namespace) -> int:
    """Run, print a table and one summary line, write the JSON.

    Raises:
        ConfigError: a bad option (named), found before anything is measured.
    """
    ids = [part.strip() for part in args.ids.split(",") if part.strip()]
    if not ids or not set(ids) <= {"contiguous", "random"}:
        raise ConfigError("--ids", f"got {args.ids!r}; give contiguous, random or both")
    if any(p % 32 for p in args.pages):
        raise ConfigError("--pages", f"page sizes must be multiples of 32 bytes, got {args.pages}")
    options.check_device("--device", args.device)
    out = check_output("--json", args.json or default_path("transfer"))
    results = run_transfer_bench(
        args.pages,
        args.blocks,
        layers=args.layers,
        ids=ids,
        max_job_bytes=args.max_job_mib * MiB,
        warmup=args.warmup,
        repeats=args.repeats,
        device=args.device,
    )
    print(
        f"{'page':>7} {'blocks':>6} {'ids':>10} {'plain':>7} {'g2c':>7} {'c2g':>7} {'both':>7}"
        "  GB/s; ratio g2c/c2g/both"
    )
    for c in results["cases"]:
        g, r = c["gbps"], c["ratio"]
        print(
            f"{_size(c['page_bytes']):>7} {c['blocks']:>6} {c['ids']:>10} {g['plain']:7.2f} "
            f"{g['g2c']:7.2f} {g['c2g']:7.2f} {g['both']:7.2f}  "
            f"{r['g2c']:.2f}/{r['c2g']:.2f}/{r['both']:.2f}"
        )
    info = results["machine"]
    figures = {k: results[k] for k in ("cases", "skipped", "summary")}
    path = write_result("transfer", results["config"], figures, out, machine=info)
    summary = ", ".join(
        f"{p} {w['g2c']:.2f}/{w['c2g']:.2f}/{w['both']:.2f} (lane {ln['g2c']:.2f}/{ln['c2g']:.2f}"
        + (f"; vs gather {v['ratio_gather']['g2c']:.2f}" if "ratio_gather" in v else "")
        + ")"
        for p, v in results["summary"].items()
        for w, ln in [(v["wall"], v["lane"])]
    )
    copier = results["config"].get("host_copier")
    print(
        f"transfer on {info['device']}{f' ({copier} host copier)' if copier else ''}: "
        "ratio to plain copy g2c/c2g/both "
        f"(median, jobs >= 16 blocks): {summary} -> {path}"
    )
    return 0
