"""bench/trl_step.py's summary: completions per second of each side and their ratio, per round and overall."""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence


def summarize(hacfed_s: Sequence[float], trl_s: Sequence[float], completions: int) -> dict[str, Any]:
    """Completions per second of each side (median over measured rounds) and hacfed/TRL ratios.

    `ratio` is the ratio of the two medians; `ratio_per_round` pairs round i of each side (run
    back to back, so they saw the same CPU speed) and `ratio_median` is their median."""
    if not hacfed_s or len(hacfed_s) != len(trl_s):
        raise ValueError(f"need the same number (>= 1) of rounds per side, got {len(hacfed_s)} and {len(trl_s)}")
    if min(list(hacfed_s) + list(trl_s)) <= 0:
        raise ValueError("round times must be > 0")
    per_round = [(completions / h) / (completions / t) for h, t in zip(hacfed_s, trl_s)]
    hacfed_cps = completions / statistics.median(hacfed_s)
    trl_cps = completions / statistics.median(trl_s)
    return {
        "completions_per_round": completions,
        "hacfed_round_s": list(hacfed_s), "trl_round_s": list(trl_s),
        "hacfed_completions_per_s": hacfed_cps, "trl_completions_per_s": trl_cps,
        "ratio": hacfed_cps / trl_cps,
        "ratio_per_round": per_round, "ratio_median": statistics.median(per_round),
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    per_round = " ".join(f"{r:.2f}" for r in summary["ratio_per_round"])
    return (
        f"hacfed: {summary['hacfed_completions_per_s']:.1f} completions/s, "
        f"TRL GRPOTrainer (GSPO): {summary['trl_completions_per_s']:.1f} completions/s "
        f"({summary['completions_per_round']} per round)\n"
        f"hacfed / TRL = {summary['ratio']:.2f}x (per round: {per_round}; median {summary['ratio_median']:.2f}x)"
    ) + _cpu(summary) + _lengths(summary)


def _cpu(summary: Mapping[str, Any]) -> str:
    cpu = summary.get("cpu")
    if not cpu:
        return ""
    per_round = " ".join(f"{r:.2f}" for r in cpu["ratio_per_round"])
    return (
        f"\nby process CPU time: hacfed {cpu['hacfed_completions_per_s']:.1f}, TRL {cpu['trl_completions_per_s']:.1f} "
        f"completions per CPU-second; hacfed / TRL = {cpu['ratio']:.2f}x (per round: {per_round}; "
        f"median {cpu['ratio_median']:.2f}x)"
    )


def _lengths(summary: Mapping[str, Any]) -> str:
    """Mean completion length of each side: equal work only if the two sample alike."""
    h, t = summary.get("hacfed_completion_tokens"), summary.get("trl_completion_tokens")
    if not h or not t:
        return ""
    return f"\nmean completion length: hacfed {statistics.mean(h):.2f} tokens, TRL {statistics.mean(t):.2f} tokens"
