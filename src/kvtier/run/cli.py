"""``kvtier run``: the main job — multi-turn chat with and without offloading, side by side.

Runs in its own process, on the GPU when there is one, else on the CPU::

    kvtier run                                   # defaults: 4 conversations x 9 turns
    kvtier run --configs none,cpu --turns 10 --json out.json --plot out.png

Prints one line per turn while it runs (stderr), then TTFT (median, p90) per
configuration, speedups against no offloading, hit ratios per tier and bytes moved;
writes a JSON result (``kvtier-results/run-<host>-<time>.json`` by default, never
overwritten) and a PNG of TTFT by turn next to it. Every option is checked before the
model is built. Exits 1 when offloading changed any generated token.
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvtier import options
from kvtier.config import DEFAULT_EVICTION_POLICY, STORE_POLICIES
from kvtier.errors import ConfigError
from kvtier.machine import check_disk, check_memory
from kvtier.results import add_json_option, check_output, default_path, write_result
from kvtier.run.configs import NAMES, Configuration, TierSizes, build_configurations, parse_names
from kvtier.run.workload import Workload, WorkloadSpec, generate_workload
from kvtier.scheduler.policies import POLICIES
from kvtier.sizes import format_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kvtier.observability.exporter import LabeledRegistries, MetricsServer

POOL_HEADROOM = 1.25
"""Default GPU pool: this many times the pages of the largest turn (prompt + answer)."""


def _range(option: str, text: str) -> tuple[int, int]:
    """``"100-300"`` -> ``(100, 300)``; ``"200"`` -> ``(200, 200)``."""
    lo, sep, hi = text.partition("-")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise ConfigError(option, f"expected N or MIN-MAX, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``kvtier run`` to ``parser``."""
    d = WorkloadSpec()
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--conversations",
        type=int,
        default=d.conversations,
        help="conversations sharing one system prompt (default: %(default)s)",
    )
    w.add_argument(
        "--turns", type=int, default=d.turns, help="turns per conversation (default: %(default)s)"
    )
    w.add_argument(
        "--system-tokens",
        type=int,
        default=d.system_tokens,
        help="tokens of the shared system prompt (default: %(default)s)",
    )
    w.add_argument(
        "--user-tokens",
        default=f"{d.user_tokens[0]}-{d.user_tokens[1]}",
        metavar="MIN-MAX",
        help="tokens of each new user message (default: %(default)s)",
    )
    w.add_argument(
        "--answer-tokens",
        default=f"{d.answer_tokens[0]}-{d.answer_tokens[1]}",
        metavar="MIN-MAX",
        help="tokens generated per turn (default: %(default)s)",
    )
    w.add_argument("--seed", type=int, default=d.seed, help="workload seed (default: 0)")
    e = parser.add_argument_group("engine")
    e.add_argument(
        "--model",
        type=Path,
        metavar="PATH",
        help="local Hugging Face checkpoint (default: the embedded model)",
    )
    e.add_argument(
        "--device", help="torch device: cpu, cuda (default: cuda if available, else cpu)"
    )
    e.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="model and KV dtype (default: float32 on CPU, bf16 on GPU; see docs/run.md)",
    )
    e.add_argument(
        "--threads",
        type=options.positive,
        default=1,
        help="torch intra-op threads (default: 1; see docs/run.md)",
    )
    e.add_argument(
        "--gpu-blocks",
        type=options.positive,
        metavar="N",
        help=f"GPU pool pages (default: {POOL_HEADROOM}x the largest turn, "
        "too small to keep the conversations)",
    )
    e.add_argument(
        "--block-size", type=options.positive, default=16, help="tokens per page (default: 16)"
    )
    o = parser.add_argument_group("offloading")
    o.add_argument(
        "--configs",
        default=",".join(NAMES),
        help="configurations to compare (default: %(default)s)",
    )
    o.add_argument(
        "--cpu-bytes",
        type=options.size,
        metavar="SIZE",
        help="CPU tier of 'cpu', e.g. 100MiB (default: 2x the workload's KV)",
    )
    o.add_argument(
        "--cpu-bytes-with-disk",
        type=options.size,
        metavar="SIZE",
        help="CPU tier of 'cpu+disk' (default: a quarter of the workload's KV)",
    )
    o.add_argument(
        "--disk-bytes",
        type=options.size,
        metavar="SIZE",
        help="disk tier of 'cpu+disk' (default: 2x the KV)",
    )
    o.add_argument(
        "--disk-path",
        type=Path,
        help="disk tier directory (default: a temporary one, removed after)",
    )
    o.add_argument(
        "--eviction-policy",
        default=DEFAULT_EVICTION_POLICY,
        choices=sorted(POLICIES),
        help=f"tiers' policy (default: the engine's, {DEFAULT_EVICTION_POLICY})",
    )
    o.add_argument(
        "--store-policy",
        default="eager",
        choices=STORE_POLICIES,
        help="when blocks are stored (default: eager)",
    )
    r = parser.add_argument_group("report")
    r.add_argument(
        "--late-turn",
        type=options.non_negative,
        metavar="K",
        help="turns with index >= K count as late (default: turns // 2)",
    )
    add_json_option(r, "run")
    r.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="TTFT-by-turn plot (default: the JSON path with .png)",
    )
    r.add_argument("--no-progress", action="store_true", help="no per-turn lines on stderr")
    r.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus metrics of every configuration's engine at "
        "http://HOST:N/metrics during the run (0: a free port), and write the last "
        "scrape next to the JSON as .prom (default: not served)",
    )
    r.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address for --metrics-port (default: %(default)s, loopback only)",
    )


def default_gpu_blocks(workload: Workload, block_size: int) -> int:
    """``POOL_HEADROOM`` times the pages of the largest turn."""
    return math.ceil(POOL_HEADROOM * math.ceil(workload.max_request_tokens / block_size))


def main(args: argparse.Namespace) -> int:
    """Run the job; 0 when every configuration produced the same tokens, 1 otherwise.

    Raises:
        ConfigError: a bad option (named), found before the model is built.
    """
    spec = WorkloadSpec(
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        user_tokens=_range("--user-tokens", args.user_tokens),
        answer_tokens=_range("--answer-tokens", args.answer_tokens),
        seed=args.seed,
    )
    names = parse_names(args.configs)
    sizes = TierSizes(
        cpu_bytes=args.cpu_bytes,
        cpu_bytes_with_disk=args.cpu_bytes_with_disk,
        disk_bytes=args.disk_bytes,
    )
    late_turn = spec.turns // 2 if args.late_turn is None else args.late_turn
    if not 0 <= late_turn < spec.turns:
        raise ConfigError("--late-turn", f"must be in 0..{spec.turns - 1}, got {late_turn}")
    if args.model is not None and not (args.model / "config.json").is_file():
        raise ConfigError("--model", f"{args.model} is not a checkpoint directory (no config.json)")
    if args.metrics_port is not None:
        from kvtier.observability.exporter import check_port

        check_port("--metrics-port", args.metrics_port)
    for option, size in (
        ("--cpu-bytes", sizes.cpu_bytes),
        ("--cpu-bytes-with-disk", sizes.cpu_bytes_with_disk),
    ):
        if size is not None:
            check_memory(option, size)
    with_disk = "cpu+disk" in names
    if sizes.disk_bytes is not None and with_disk:
        check_disk("--disk-bytes", args.disk_path or Path(tempfile.gettempdir()), sizes.disk_bytes)
    json_path = check_output("--json", args.json or default_path("run"))
    plot_path = check_output("--plot", args.plot or json_path.with_suffix(".png"))
    if args.disk_path is not None and with_disk:  # last: it creates the directory
        options.writable_directory("--disk-path", args.disk_path, create=True)

    print("kvtier run: loading torch and the model ...", flush=True)
    import torch  # only now: the option errors above come without torch's start-up cost

    from kvtier.engine import load_model
    from kvtier.engine.kv_pool import KVShape

    options.check_device("--device", args.device)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = load_model(args.model, device=args.device, dtype=dtype)
    workload = generate_workload(spec, model.config.get_text_config().vocab_size)
    layout = KVShape.of_model(model)
    elem = torch.empty((), dtype=layout.dtype).element_size()
    kv_per_token = 2 * layout.num_layers * layout.num_kv_heads * layout.head_dim * elem
    kv_bytes = workload.distinct_tokens() * kv_per_token
    needed = math.ceil(workload.max_request_tokens / args.block_size)
    gpu_blocks = args.gpu_blocks or default_gpu_blocks(workload, args.block_size)
    if gpu_blocks < needed:
        raise ConfigError(
            "--gpu-blocks",
            f"{gpu_blocks} pages cannot hold the largest turn "
            f"({workload.max_request_tokens} tokens = {needed} pages); give at least {needed}",
        )
    temp_dir = None
    disk_path = args.disk_path
    try:
        if disk_path is None and with_disk:
            # Ctrl-C and SIGTERM wait until temp_dir is set, so that finally removes it.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                temp_dir = disk_path = Path(tempfile.mkdtemp(prefix="kvtier-run-"))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        configs = build_configurations(
            names,
            kv_bytes,
            args.block_size,
            str(disk_path),
            sizes,
            args.eviction_policy,
            args.store_policy,
        )
        return _run_and_report(
            args, model, workload, configs, gpu_blocks, kv_bytes, late_turn, json_path, plot_path
        )
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _run_and_report(
    args: argparse.Namespace,
    model: PreTrainedModel,
    workload: Workload,
    configs: Sequence[Configuration],
    gpu_blocks: int,
    kv_bytes: int,
    late_turn: int,
    json_path: Path,
    plot_path: Path,
) -> int:
    import torch

    from kvtier.run.job import compare_outputs, run_job
    from kvtier.run.plot import plot_ttft
    from kvtier.run.report import describe_setup, format_report, summarize, to_json

    print(
        f"model: {args.model or 'embedded default'} on {model.device} ({model.dtype}), "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(describe_setup(workload, gpu_blocks, args.block_size, kv_bytes))
    for c in configs:
        shown = "no offloading" if c.offload is None else _describe(c.offload)
        print(f"config {c.name}: {shown}")
    sys.stdout.flush()
    progress = None if args.no_progress else sys.stderr
    metrics, server = _serve_metrics(args)
    try:
        runs = run_job(model, workload, configs, gpu_blocks, args.block_size, progress, metrics)
    finally:
        final_scrape = None
        if server is not None:
            from prometheus_client import generate_latest

            final_scrape = generate_latest(metrics)  # type: ignore[arg-type]
            server.close()
    mismatches = compare_outputs(runs)
    summaries = [summarize(run, late_turn) for run in runs]
    history: dict[int, list[int]] = {}
    for t in workload.turns:
        history.setdefault(t.index, []).append(t.history_tokens)
    history_by_turn = {i: round(statistics.median(v)) for i, v in history.items()}
    print()
    print(format_report(summaries, mismatches, late_turn, history_by_turn))
    config = {
        "workload": {k: getattr(workload.spec, k) for k in workload.spec.__dataclass_fields__},
        "model": str(args.model) if args.model else "embedded default",
        "device": str(model.device),
        "dtype": str(model.dtype),
        "threads": torch.get_num_threads(),
        "gpu_blocks": gpu_blocks,
        "block_size": args.block_size,
        "late_turn": late_turn,
        "workload_kv_bytes": kv_bytes,
        "configurations": {c.name: dict(c.offload) if c.offload else None for c in configs},
    }
    path = write_result("run", config, to_json(runs, summaries, mismatches), json_path)
    plot_ttft(runs, plot_path, f"kvtier run: TTFT by turn ({platform.node()})")
    print(f"wrote {path} and {plot_path}")
    if final_scrape is not None:
        prom = path.with_suffix(".prom")
        prom.write_bytes(final_scrape)
        print(f"wrote {prom} (the last scrape of /metrics)")
    return 1 if mismatches else 0


def _describe(offload: Mapping[str, object]) -> str:
    """An offload dict as a user reads it: sizes in binary units, not byte counts."""
    return ", ".join(
        f"{k}={format_bytes(v) if k.endswith('_bytes_to_use') and isinstance(v, int) else v}"
        for k, v in offload.items()
    )


def _serve_metrics(
    args: argparse.Namespace,
) -> tuple[LabeledRegistries | None, MetricsServer | None]:
    """With ``--metrics-port``: every engine's metrics on one port, labelled ``config``."""
    if args.metrics_port is None:
        return None, None
    from kvtier.observability.exporter import LabeledRegistries, MetricsServer

    metrics = LabeledRegistries("config")
    server = MetricsServer(metrics, args.metrics_port, args.metrics_host)
    print(f"metrics: {server.url} (configurations labelled config=...)", flush=True)
    return metrics, server
