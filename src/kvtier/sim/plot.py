"""Hit ratio against capacity, one line per policy plus Belady, as a PNG.

Runs in the ``kvtier simulate`` process with matplotlib's Agg backend (no display
needed). matplotlib is imported only here, only when a plot is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.sim.sweep import SweepPoint


def plot_sweep(points: Sequence[SweepPoint], path: str | Path, title: str) -> None:
    """Draw the block hit ratio of each policy (and Belady) against capacity.

    Raises:
        ConfigError: matplotlib is not installed (key ``--plot``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", "drawing needs matplotlib: pip install matplotlib") from None
    xs = [point.capacity_blocks for point in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    policies = [run.policy for run in points[0].runs] if points else []
    for index, policy in enumerate(policies):
        ys = [100 * point.runs[index].ratios.block_hit_ratio for point in points]
        ax.plot(xs, ys, marker="o", label=policy)
    if points and all(point.belady is not None for point in points):
        ys = [100 * point.belady.block_hit_ratio for point in points if point.belady]
        ax.plot(xs, ys, marker="s", linestyle="--", color="black", label="Belady (offline)")
    if xs and min(xs) > 0:
        ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{p.capacity}\n{p.capacity_blocks}" for p in points], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("capacity (as given / blocks)")
    ax.set_ylabel("block hit ratio (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
