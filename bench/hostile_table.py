"""The hostile-peers table of docs/results.md: kind of peer × mode × honest agent, from bench/hostile.toml's runs.

    python bench/hostile_table.py --matrix bench/hostile.toml --out runs/hostile

For each three-lab setting (one bad lab beside the honest pair), mode and honest agent it prints the final
greedy held-out accuracy and two paired differences over the seeds both runs have (95 % Student-t
intervals, hacfed.tools.experiments.stats):

  vs alone    against the same agent trained alone with the same rollouts per lab (the honest setting's
              baseline mode, GSPO×2): the done-when of "safe to join";
  vs honest   against the same agent and mode in the honest two-lab federation: what the bad lab costs
              (or gives) compared with leaving it out;

then the canary rate (the fraction of the learner's greedy and sampled held-out answers that hold the
canary's TEXT, `eval_canary_rate`; settings with a canary lab only) and the bad lab's mean verified P̂
over the rounds (the `capability` the coordinator reports; what earns reach under `successes`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hacfed.tools import hostile
from hacfed.tools.experiments.matrix import Matrix, MatrixError, Setting, load_matrix
from hacfed.tools.experiments.results import load_setting
from hacfed.tools.experiments.runner import is_complete, runs_of
from hacfed.tools.experiments.stats import Estimate, PairedDifference, mean_ci, paired_difference

HONEST = "honest"  # the setting without a bad lab
DONE_WHEN_LOWER_BOUND = -0.01  # issue's bar: the paired 95 % CI's lower bound against training alone


@dataclass(frozen=True)
class Row:
    setting: str
    mode: str
    agent: str
    accuracy: Estimate
    vs_alone: PairedDifference | None
    vs_honest: PairedDifference | None
    canary_rate: Estimate | None
    bad_capability: Estimate | None

    @property
    def safe(self) -> bool | None:
        """The bar: the lower bound against training alone is >= DONE_WHEN_LOWER_BOUND (None: no interval)."""
        d = self.vs_alone
        if d is None or d.estimate.half_width is None:
            return None
        return d.estimate.mean - d.estimate.half_width >= DONE_WHEN_LOWER_BOUND


def final_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def canary_and_capability(setting: Setting, mode: str, agent: str,
                          out: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Seed -> the agent's final `eval_canary_rate`, and seed -> the bad lab's mean `capability` over rounds."""
    canary: dict[int, float] = {}
    capability: dict[int, float] = {}
    bad = [pid for pid, spec in zip(setting.agent_ids, setting.agents) if hostile.is_hostile(spec)]
    for run in runs_of(setting):
        if run.mode != mode or not is_complete(run, out):
            continue
        rows = final_rows(run.metrics_path(out))
        finals = [r for r in rows if r.get("agent") == agent and r.get("final") is True]
        rate = finals[-1].get("eval_canary_rate") if finals else None
        if isinstance(rate, (int, float)):
            canary[run.seed] = float(rate)
        caps = [float(r["capability"]) for r in rows if bad and r.get("agent") == bad[0]
                and isinstance(r.get("capability"), (int, float)) and r.get("final") is not True]
        if caps:
            capability[run.seed] = sum(caps) / len(caps)
    return canary, capability


def table_rows(matrix: Matrix, out: Path) -> list[Row]:
    honest = matrix.setting(HONEST)
    honest_results = load_setting(honest, out)
    alone_mode = honest.run.baseline
    rows: list[Row] = []
    for setting in matrix.settings:
        if setting.name == HONEST:
            continue
        results = load_setting(setting, out)
        for mode in setting.run.modes:
            for agent in honest.agent_ids:
                finals = results.by_seed(mode, agent, "accuracy")
                if not finals:
                    continue
                canary, capability = canary_and_capability(setting, mode, agent, out)
                rows.append(Row(
                    setting.name, mode, agent, mean_ci(list(finals.values())),
                    paired_difference(finals, honest_results.by_seed(alone_mode, agent, "accuracy")),
                    (paired_difference(finals, honest_results.by_seed(mode, agent, "accuracy"))
                     if mode in honest.run.modes else None),
                    mean_ci(list(canary.values())) if canary else None,
                    mean_ci(list(capability.values())) if capability else None,
                ))
    return rows


def honest_rows(matrix: Matrix, out: Path) -> list[tuple[str, str, Estimate, PairedDifference | None]]:
    """(mode, agent, final accuracy, against training alone) in the honest setting."""
    honest = matrix.setting(HONEST)
    results = load_setting(honest, out)
    alone = honest.run.baseline
    out_rows = []
    for mode in honest.run.modes:
        for agent in honest.agent_ids:
            finals = results.by_seed(mode, agent, "accuracy")
            if finals:
                diff = None if mode == alone else paired_difference(finals, results.by_seed(alone, agent, "accuracy"))
                out_rows.append((mode, agent, mean_ci(list(finals.values())), diff))
    return out_rows


def _est(e: Estimate | None, digits: int = 3) -> str:
    if e is None:
        return ""
    return f"{e.mean:.{digits}f}" if e.half_width is None else f"{e.mean:.{digits}f} ± {e.half_width:.{digits}f}"


def _diff(d: PairedDifference | None) -> str:
    if d is None:
        return ""
    text = f"{d.estimate.mean:+.3f}" + ("" if d.estimate.half_width is None else f" ± {d.estimate.half_width:.3f}")
    above = d.estimate.half_width is not None and d.estimate.mean - d.estimate.half_width > 0
    below = d.estimate.half_width is not None and d.estimate.mean + d.estimate.half_width < 0
    text = f"**{text}**" if above or below else text
    return f"{text} ({d.positive}/{len(d.seeds)})"


def _rate(e: Estimate | None) -> str:
    if e is None:
        return ""
    return f"{100 * e.mean:.2f} %" + ("" if e.half_width is None else f" ± {100 * e.half_width:.2f}")


def render(matrix: Matrix, out: Path, command: str) -> str:
    honest = matrix.setting(HONEST)
    label = {1: "alone", 2: "honest pair"}.get(len(honest.agent_ids), f"{len(honest.agent_ids)} honest labs")
    lines = [f"Generated by `{command}`. Final greedy accuracy on the {honest.run.eval_problems:,} "
             f"{honest.run.eval_split} problems; paired differences "
             "are per seed, mean ± 95 % CI (bold: the interval excludes 0), then (seeds above / seeds).", ""]
    lines += ["| honest setting | mode | agent | final accuracy | vs alone (GSPO×2) |", "|---|---|---|---|---|"]
    for mode, agent, acc, diff in honest_rows(matrix, out):
        lines.append(f"| {label} | {mode} | {agent} | {_est(acc)} | {_diff(diff)} |")
    lines += ["", "| bad lab (setting) | mode | agent | final accuracy | vs alone (GSPO×2) | vs honest pair, same mode "
              "| lower bound ≥ −0.01 | canary rate | bad lab's P̂ |", "|---|---|---|---|---|---|---|---|---|"]
    for r in table_rows(matrix, out):
        safe = {True: "yes", False: "**no**", None: ""}[r.safe]
        lines.append(f"| {r.setting} | {r.mode} | {r.agent} | {_est(r.accuracy)} | {_diff(r.vs_alone)} | "
                     f"{_diff(r.vs_honest)} | {safe} | {_rate(r.canary_rate)} | {_est(r.bad_capability, 2)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--matrix", default="bench/hostile.toml", help="the matrix file (default: bench/hostile.toml)")
    p.add_argument("--out", default="runs/hostile", help="where `hacfed bench modes` wrote its runs")
    args = p.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix)
        matrix.setting(HONEST)
    except MatrixError as exc:
        print(f"hostile_table: {exc}", file=sys.stderr)
        return 2
    print(render(matrix, Path(args.out), f"python bench/hostile_table.py --matrix {args.matrix} --out {args.out}"),
          end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
