"""TTFT by turn index, one line per configuration, as a PNG (log y axis).

Runs in the ``kvtier run`` process with matplotlib's Agg backend (no display needed).
matplotlib is imported only here, only when a plot is drawn.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.run.job import ConfigRun


def plot_ttft(runs: Sequence[ConfigRun], path: str | Path, title: str) -> None:
    """Draw every turn's TTFT (dots) and the median per turn index (line) per configuration.

    Skipped configurations are left out.

    Raises:
        ConfigError: matplotlib is not installed (key ``--plot``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter, MaxNLocator
    except ImportError:
        raise ConfigError("--plot", "drawing needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        if not run.turns:
            continue
        by_index: dict[int, list[float]] = {}
        for t in run.turns:
            by_index.setdefault(t.turn, []).append(t.ttft_s)
        indices = sorted(by_index)
        medians = [statistics.median(by_index[i]) for i in indices]
        (line,) = ax.plot(indices, medians, marker="o", label=f"{run.config.name} (median)")
        ax.scatter(
            [t.turn for t in run.turns],
            [t.ttft_s for t in run.turns],
            s=10,
            alpha=0.35,
            color=line.get_color(),
        )
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("turn index (history grows with each turn)")
    ax.set_ylabel("time to first token (s, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
