"""bench/trl_step.py's summary: completions and completion tokens per second of each side and their
ratios, per round and overall."""

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


def per_token(hacfed_s: Sequence[float], trl_s: Sequence[float], completions: int,
              hacfed_tokens: Sequence[float], trl_tokens: Sequence[float]) -> dict[str, Any]:
    """Completion tokens per second of each side and hacfed/TRL ratios; `*_tokens` are each round's
    mean completion length (EOS excluded), so a side that samples longer answers is not counted as
    slower for the extra work.

    `ratio` divides each side's tokens over its measured rounds by its seconds over them;
    `ratio_per_round` pairs round i of each side and `ratio_median` is their median."""
    rounds = summarize(hacfed_s, trl_s, completions)  # the same checks of the rounds' times
    if len(hacfed_tokens) != len(hacfed_s) or len(trl_tokens) != len(trl_s):
        raise ValueError(f"need one mean length per round, got {len(hacfed_tokens)} and {len(trl_tokens)} "
                         f"for {len(hacfed_s)} rounds")
    if min(list(hacfed_tokens) + list(trl_tokens)) <= 0:
        raise ValueError("mean completion lengths must be > 0 (a side sampled only empty answers)")
    hacfed_tps = completions * sum(hacfed_tokens) / sum(hacfed_s)
    trl_tps = completions * sum(trl_tokens) / sum(trl_s)
    per_round = [r * h / t for r, h, t in zip(rounds["ratio_per_round"], hacfed_tokens, trl_tokens)]
    return {"hacfed_tokens_per_s": hacfed_tps, "trl_tokens_per_s": trl_tps, "ratio": hacfed_tps / trl_tps,
            "ratio_per_round": per_round, "ratio_median": statistics.median(per_round)}


def format_summary(summary: Mapping[str, Any]) -> str:
    per_round = " ".join(f"{r:.2f}" for r in summary["ratio_per_round"])
    return (
        f"hacfed: {summary['hacfed_completions_per_s']:.1f} completions/s, "
        f"TRL GRPOTrainer (GSPO): {summary['trl_completions_per_s']:.1f} completions/s "
        f"({summary['completions_per_round']} per round)\n"
        f"hacfed / TRL = {summary['ratio']:.2f}x (per round: {per_round}; median {summary['ratio_median']:.2f}x)"
    ) + _cpu(summary) + _lengths(summary) + _tokens(summary)


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


def _tokens(summary: Mapping[str, Any]) -> str:
    """The per-token figures, by wall and by CPU time, when the run measured them."""
    out = ""
    for key, clock in (("per_token", "wall"), ("cpu_per_token", "process CPU")):
        t = summary.get(key)
        if t:
            per_round = " ".join(f"{r:.2f}" for r in t["ratio_per_round"])
            out += (f"\nper completion token, by {clock} time: hacfed {t['hacfed_tokens_per_s']:.1f}, TRL "
                    f"{t['trl_tokens_per_s']:.1f} tokens/s; hacfed / TRL = {t['ratio']:.2f}x (per round: {per_round}; "
                    f"median {t['ratio_median']:.2f}x)")
    return out
