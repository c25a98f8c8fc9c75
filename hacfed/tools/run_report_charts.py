"""The charts of `hacfed report`: each one a function that draws on a matplotlib Axes.

The HTML report (hacfed.tools.run_report_html) gives each chart a figure of its own; the PNG report puts
the run-wide ones on one grid. Drawing on a given Axes keeps the two from diverging. Which charts a
run gets depends on what its rows logged (`charts_for`): a run without cross samples (a single lab,
`gspo`) has no ratio charts, one without a journal no rejection codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from hacfed.tools.run_report import (
    PLOT_LOG_RANGE,
    PLOT_MAX_ABS,
    QUANTILES,
    RunData,
    capability_ratios,
    cross_stats,
    plottable,
    ratio_quantile_samples,
    series,
)

Draw = Callable[[Any], None]  # draws on one matplotlib Axes


@dataclass(frozen=True)
class Chart:
    title: str
    caption: str  # what the reader sees, and what it is computed from
    draw: Draw


LEGEND_ROWS = 12  # entries per legend column; more go to a second column


def text(value: object) -> str:
    """A name from the data (lab id, source, code) as matplotlib shows it verbatim: a `$` would start
    mathtext, and a lab-chosen `$\\frac{$` would fail the whole report."""
    return str(value).replace("$", r"\$")


def _finish(ax: Any, title: str, xlabel: str, ylabel: str, legend: bool = True, left_out: int = 0) -> None:
    ax.set_title(title, fontsize=10)
    if left_out:
        low, high = PLOT_LOG_RANGE
        xlabel += (f"\n({left_out} values not finite or beyond ±{PLOT_MAX_ABS:.0e} "
                   f"(log axes: outside [{low:.0e}, {high:.0e}]) left out)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    entries = len(ax.get_legend_handles_labels()[0])
    if legend and entries:
        # Outside the plot area, at its right: inside, a legend of many series (the ratio histogram
        # has one per agent x source x quantile) covers the curves.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False,
                  ncol=math.ceil(entries / LEGEND_ROWS))


def _plot_series(ax: Any, points: list[tuple[int, float]], log: bool = False, **style: Any) -> int:
    """Draws what `plottable` keeps; returns how many points it left out."""
    points, left_out = plottable(points, log=log)
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], **style)
    return left_out


def draw_metric(data: RunData, key: str, ylabel: str, final: bool) -> Draw:
    def draw(ax: Any) -> None:
        left_out = sum(_plot_series(ax, series(data.rows, agent, key, final=final), marker="o", markersize=3,
                                    label=text(agent)) for agent in data.agents)
        _finish(ax, ylabel + " per lab", "round", ylabel, left_out=left_out)
    return draw


def draw_lab_curves(data: RunData, agent: str) -> Draw:
    def draw(ax: Any) -> None:
        left_out = (
            _plot_series(ax, series(data.rows, agent, "eval_accuracy", final=True), marker="o",
                         label="held-out accuracy")
            + _plot_series(ax, series(data.rows, agent, "eval_pass1", final=True), marker="s", label="sampled pass@1")
            + _plot_series(ax, series(data.rows, agent, "reward_mean"), marker=".", alpha=0.8, label="mean reward")
            + _plot_series(ax, series(data.rows, agent, "capability"), linestyle="--", label="capability P̂"))
        _finish(ax, f"{text(agent)}: accuracy, reward and P̂", "round", "value", left_out=left_out)
    return draw


# How a lab's partners' samples act on it (docs/partner_rules.md "What a lab sees every update"): shares in [0, 1].
LEARNER_SHARES = (("train/partner/grad_frac", "partners' samples with gradient (rules)"),
                  ("train/cross_grad_frac", "partners' samples with gradient"),
                  ("train/partner/in_context_frac", "partners' samples as hints"),
                  ("train/answer_form_start_share", "answers in its starting form"),
                  ("train/rollout_truncated_frac", "responses cut at the budget"))
TRUST_PREFIX = "train/trust/"


def trust_keys(data: RunData, agent: str) -> list[str]:
    return sorted({str(k) for r in data.rows if r["agent"] == agent for k in r if str(k).startswith(TRUST_PREFIX)})


def has_learner_view(data: RunData, agent: str) -> bool:
    keys = [k for k, _ in LEARNER_SHARES] + ["train/kl"] + trust_keys(data, agent)
    return any(series(data.rows, agent, key) for key in keys)


def draw_learner(data: RunData, agent: str) -> Draw:
    def draw(ax: Any) -> None:
        left_out = sum(_plot_series(ax, series(data.rows, agent, key), marker=".", label=label)
                       for key, label in LEARNER_SHARES)
        left_out += sum(_plot_series(ax, series(data.rows, agent, key), linestyle="--", marker=".",
                                     label=f"trust in {text(key[len(TRUST_PREFIX):])}")
                        for key in trust_keys(data, agent))
        kl = series(data.rows, agent, "train/kl")
        if kl:  # its own scale, on the right; its legend entry with the others
            style = {"color": "black", "linestyle": ":", "marker": "x"}
            twin = ax.twinx()
            left_out += _plot_series(twin, kl, **style)
            twin.set_ylabel("KL to the start model")
            ax.plot([], [], label="KL to the start model (right axis)", **style)
        _finish(ax, f"{text(agent)}: its partners' samples, its drift and its trust", "round", "share",
                left_out=left_out)
    return draw


def draw_omega(data: RunData) -> Draw:
    def draw(ax: Any) -> None:
        left_out = sum(_plot_series(ax, points, log=True, marker=".", label=f"{text(learner)} ← {text(source)}")
                       for (learner, source), points in sorted(capability_ratios(data.rows, data.agents).items()))
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        _finish(ax, "capability ratio ω = P̂_source / P̂_learner", "round", "ω (log scale)", left_out=left_out)
    return draw


def draw_cross_over_time(data: RunData, agent: str) -> Draw:
    def draw(ax: Any) -> None:
        left_out = 0
        for source, stats in sorted(cross_stats(data.rows, agent).items()):
            parts = {q: plottable(stats.get(q, []), log=True) for q in ("ratio_p50", "ratio_p10", "ratio_p90")}
            left_out += sum(n for _, n in parts.values())
            mid = parts["ratio_p50"][0]
            if not mid:
                continue
            (line,) = ax.plot([p[0] for p in mid], [p[1] for p in mid], marker=".", label=f"{text(source)} p50")
            low, high = dict(parts["ratio_p10"][0]), dict(parts["ratio_p90"][0])
            band = [r for r, _ in mid if r in low and r in high]
            if band:
                ax.fill_between(band, [low[r] for r in band], [high[r] for r in band], color=line.get_color(),
                                alpha=0.2, label=f"{text(source)} p10–p90")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        _finish(ax, f"{text(agent)}: importance ratio of each source's samples", "round", "ratio (log scale)",
                left_out=left_out)
    return draw


def draw_cross_hist(data: RunData, agents: list[str]) -> Draw:
    def draw(ax: Any) -> None:
        groups = [(f"{text(agent)} ← {text(source)} {q.removeprefix('ratio_')}", values)
                  for agent in agents for source, by_q in sorted(ratio_quantile_samples(data.rows, agent).items())
                  for q, values in by_q.items() if q in QUANTILES]
        kept = [plottable(list(enumerate(values)), log=True) for _, values in groups]
        left_out = sum(n for _, n in kept)
        logs = [[math.log10(v) for _, v in points] for points, _ in kept]
        every = [v for vs in logs for v in vs]
        if every:
            lo, hi = min(every), max(every)
            bins = [lo + (hi - lo + 1e-9) * i / 20 for i in range(21)]
            for (label, _), values in zip(groups, logs):
                ax.hist(values, bins=bins, histtype="step", linewidth=1.4, label=label)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        _finish(ax, "cross-sample ratios: per-round p10 / p50 / p90", "log10 ratio", "rounds", left_out=left_out)
    return draw


def draw_codes(data: RunData) -> Draw:
    def draw(ax: Any) -> None:
        labels, counts = [], []
        for kind, table in (("rejected", data.rejections), ("refused", data.refusals)):
            for agent in sorted(table):
                for code, n in sorted(table[agent].items()):
                    labels.append(text(f"{agent} {kind} {code.removeprefix('HACFED-E-')}"))
                    counts.append(n)
        ax.barh(range(len(counts)), counts, color="tab:red")
        ax.set_yticks(range(len(counts)), labels, fontsize=7)
        ax.invert_yaxis()
        _finish(ax, "rejections by error code (journal)", "count", "", legend=False)
    return draw


def draw_accepted(data: RunData) -> Draw:
    def draw(ax: Any) -> None:
        left_out = 0
        for agent in data.agents:
            accepted = series(data.rows, agent, "accepted")
            left_out += _plot_series(ax, accepted, marker=".", label=f"{text(agent)} accepted")
            rejected = series(data.rows, agent, "rejected")
            if any(v for _, v in rejected):
                left_out += _plot_series(ax, rejected, marker="x", linestyle=":", label=f"{text(agent)} rejected")
        _finish(ax, "trajectories accepted / rejected per round", "round", "trajectories", left_out=left_out)
    return draw


def has(data: RunData, key: str) -> bool:
    return any(series(data.rows, agent, key, final=True) for agent in data.agents)


def overview_charts(data: RunData) -> list[Chart]:
    """The run-wide charts, in reading order (both report formats)."""
    charts = []
    if has(data, "eval_accuracy"):
        charts.append(Chart("Held-out accuracy", "Greedy accuracy on held-out problems on evaluation rounds and "
                            "after the final pool (`eval_accuracy`).", draw_metric(data, "eval_accuracy",
                                                                                  "held-out accuracy", True)))
    if has(data, "reward_mean"):
        charts.append(Chart("Reward", "Mean verified reward of each lab's own rollouts per round (`reward_mean`).",
                            draw_metric(data, "reward_mean", "mean reward", False)))
    if has(data, "capability"):
        charts.append(Chart("Capability P̂", "The coordinator's capability estimate of each lab after each round "
                            "(`capability`).", draw_metric(data, "capability", "capability P̂", False)))
    if capability_ratios(data.rows, data.agents):
        charts.append(Chart("Capability ratios", "ω = clip(P̂_source / P̂_learner, 0.1, 10) (Eq. 10) from the logged "
                            "P̂, per learner ← source: the weight of a source's samples in the learner's update.",
                            draw_omega(data)))
    with_cross = [a for a in data.agents if ratio_quantile_samples(data.rows, a)]
    if with_cross:
        charts.append(Chart("Cross-ratio histogram", "Distribution over rounds of the importance-ratio quantiles "
                            "p10/p50/p90 each update logged per source (`train/cross/SOURCE/ratio_p*`); per-sample "
                            "ratios are not logged.", draw_cross_hist(data, with_cross)))
    if has(data, "sim/finish_s"):
        charts.append(Chart("Simulated clock", "When each lab's step of each round was done on the simulated clock "
                            "of a paced `hacfed sim` run, the final update last (`sim/finish_s`): a faster lab's line "
                            "is lower and may run up to K rounds ahead.",
                            draw_metric(data, "sim/finish_s", "simulated seconds", True)))
    if has(data, "sim/staleness_mean"):
        charts.append(Chart("Staleness", "Mean age in rounds of the samples each lab's update of that step trained "
                            "on (`sim/staleness_mean`; 0: all from the round just before, as in a synchronous run).",
                            draw_metric(data, "sim/staleness_mean", "staleness (rounds)", True)))
    if has(data, "accepted"):
        charts.append(Chart("Accepted and rejected", "Trajectories the coordinator accepted and rejected per lab and "
                            "round (`accepted`, `rejected`).", draw_accepted(data)))
    if data.rejections or data.refusals:
        charts.append(Chart("Rejections by code", "From the coordinator's journal: rejected trajectories and refused "
                            "submissions, by HACFED-E code.", draw_codes(data)))
    return charts


def lab_charts(data: RunData, agent: str) -> list[Chart]:
    charts = [Chart(f"{agent}: curves", "Held-out accuracy, mean reward and capability of this lab.",
                    draw_lab_curves(data, agent))]
    if cross_stats(data.rows, agent).keys() and ratio_quantile_samples(data.rows, agent):
        charts.append(Chart(f"{agent}: cross ratios over time", "Per source: median importance ratio (line) and "
                            "p10–p90 (band) of the samples this lab trained on.", draw_cross_over_time(data, agent)))
        charts.append(Chart(f"{agent}: cross-ratio histogram", "This lab's per-round ratio quantiles per source.",
                            draw_cross_hist(data, [agent])))
    if has_learner_view(data, agent):
        charts.append(Chart(f"{agent}: partners' samples and drift", "From this lab's step reports: the share of "
                            "its partners' samples that carried gradient or served as hints, the share of its answers "
                            "still in the form of its first rollout, the share cut at the budget, its trust weight in "
                            "each partner (`train/trust/*`) and, on the right axis, the KL of its own samples to the "
                            "model it started from (`train/kl`).", draw_learner(data, agent)))
    return charts
