"""Learning-curve plot of one setting of a modes matrix: greedy held-out accuracy vs round, per mode.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes --report-only   # writes docs/img/modes-*.png

One subplot per agent; one line per mode (mean over seeds) with a light band for its 95 % CI.
"""

from __future__ import annotations

import os
from pathlib import Path

from hacfed.tools.experiments.results import SettingResults
from hacfed.tools.experiments.stats import mean_ci


def plot_setting(results: SettingResults, path: Path) -> Path:
    """Write the PNG (atomically) and return its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    setting = results.setting
    agents = setting.agent_ids
    fig, axes = plt.subplots(1, len(agents), figsize=(4.6 * len(agents), 3.6), squeeze=False, sharey=True)
    for ax, agent in zip(axes[0], agents):
        for mode in setting.run.modes:
            curve = results.curve(mode, agent)
            if not curve:
                continue
            rounds = list(curve)
            estimates = [mean_ci(values) for values in curve.values()]
            means = [e.mean for e in estimates]
            style = "--" if mode == setting.run.baseline else "-"
            (line,) = ax.plot(rounds, means, style, marker="o", markersize=3, label=mode)
            if any(e.half_width is not None for e in estimates):
                half = [e.half_width or 0.0 for e in estimates]
                ax.fill_between(rounds, [m - h for m, h in zip(means, half)], [m + h for m, h in zip(means, half)],
                                color=line.get_color(), alpha=0.12, linewidth=0)
        ax.set_title(agent)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("greedy held-out accuracy")
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{setting.name}: mean over seeds, band = 95 % CI ({setting.run.baseline} dashed)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
