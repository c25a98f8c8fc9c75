"""The labs-of-different-speeds table of docs/results.md, from bench/staleness.toml's runs.

    python bench/staleness_table.py --matrix bench/staleness.toml --out runs/staleness

Per setting (speed ratio, max_staleness K) and agent, over the seeds of its runs (`sim/*` metrics rows
of a paced `hacfed sim`, docs/staleness.md):

  final accuracy     greedy, on the held-out problems, after the same 20 steps of its own in every setting
  vs K = 0           paired by seed against the synchronous setting at the same speeds (95 % Student-t CI)
  trained, stale     samples trained on over the run, and their mean staleness (rounds)
  idle               simulated idle time as a share of the lab's simulated run time
  time to target     for the fast lab (the first agent): the simulated time at which an evaluation first
                     reaches the same seed's synchronous final accuracy, over the synchronous run's whole
                     simulated time (the issue's bar: at most 0.5); "never" when no evaluation reaches it

A setting with `round_join = "newest"` (docs/staleness.md, "Joining the newest round": a lab joins the
newest round, a slow one skips rounds, each evaluates every `eval_every` of its OWN steps) has a table
of its own, against the synchronous setting at the same speeds:

  own steps          rounds the lab rolled out (its final update not counted)
  at own step        the largest own step n at which both runs evaluated the lab (the synchronous
                     run's own step is its round), per seed; a range when seeds differ
  accuracy, vs K = 0 the lab's accuracy at own step n, and paired by seed against the synchronous
                     run's at the same n: after an equal number of its own rollouts and updates
  final accuracy     after its final update
  skipped            samples of its peers' older rounds it was not sent (`sim/skipped_samples`: of each
                     peer only the newest round is sent), summed over its run
  run time           the lab's simulated run time over the synchronous run's (same lab)
  time to target     as above, for the fast lab
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hacfed.tools.experiments.matrix import Matrix, MatrixError, Setting, load_matrix
from hacfed.tools.experiments.runner import is_complete, runs_of
from hacfed.tools.experiments.stats import Estimate, mean_ci, paired_difference


def agent_rows(setting: Setting, out: Path) -> dict[int, dict[str, list[dict]]]:
    """Seed -> agent -> its metrics rows, over the complete runs of the setting's first mode."""
    found: dict[int, dict[str, list[dict]]] = {}
    for run in runs_of(setting):
        if run.mode == setting.run.modes[0] and is_complete(run, out):
            text = run.metrics_path(out).read_text(encoding="utf-8")
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            found[run.seed] = {a: [r for r in rows if r.get("agent") == a] for a in setting.agent_ids}
    return found


def own_step(row: dict) -> int:
    """How many rounds the lab rolled out before this row's step: `sim/own_step` under round_join
    "newest", else the round (every lab rolls out every round)."""
    return int(row.get("sim/own_step", row["round"]))


def accuracy_at(rows: Sequence[dict]) -> dict[int, float]:
    """Own step -> the lab's greedy accuracy evaluated there."""
    return {own_step(r): float(r["eval_accuracy"]) for r in rows if isinstance(r.get("eval_accuracy"), (int, float))}


def final_accuracy(rows: Sequence[dict]) -> float | None:
    finals = [r for r in rows if r.get("final") is True and isinstance(r.get("eval_accuracy"), (int, float))]
    return float(finals[-1]["eval_accuracy"]) if finals else None


def end_time(rows: Sequence[dict]) -> float:
    return max(float(r.get("sim/finish_s", 0.0)) for r in rows)


def time_to(rows: Sequence[dict], target: float) -> float | None:
    """The simulated finish time of the first evaluated step whose greedy accuracy is >= target."""
    for r in sorted((r for r in rows if isinstance(r.get("eval_accuracy"), (int, float))),
                    key=lambda r: float(r["sim/finish_s"])):
        if r["eval_accuracy"] >= target - 1e-12:
            return float(r["sim/finish_s"])
    return None


def staleness(rows: Sequence[dict]) -> tuple[float, float]:
    """(samples trained on over the run, their mean staleness)."""
    trained = sum(float(r.get("sim/trained_samples", 0.0)) for r in rows)
    weighted = sum(float(r.get("sim/trained_samples", 0.0)) * float(r.get("sim/staleness_mean", 0.0)) for r in rows)
    return trained, (weighted / trained if trained else 0.0)


def idle_share(rows: Sequence[dict]) -> float:
    total = end_time(rows)
    return sum(float(r.get("sim/idle_s", 0.0)) for r in rows) / total if total else 0.0


def synchronous_of(matrix: Matrix, setting: Setting) -> Setting | None:
    """The K = 0 setting with the same agents and speeds."""
    for other in matrix.settings:
        if (other.run.max_staleness == 0 and other.run.round_join == "every" and other.agents == setting.agents
                and other.run.lab_speed == setting.run.lab_speed):
            return other
    return None


def _est(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return ""
    e: Estimate = mean_ci(list(values))
    return f"{e.mean:.{digits}f}" if e.half_width is None else f"{e.mean:.{digits}f} ± {e.half_width:.{digits}f}"


def render(matrix: Matrix, out: Path, command: str) -> str:
    lines = [f"Generated by `{command}`. Means over seeds ± 95 % CI; paired differences per seed, then "
             "(seeds above / seeds).", "",
             "| setting | K | agent | final accuracy | vs K = 0 | trained | staleness | idle | time to target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for setting in matrix.settings:
        if setting.run.round_join != "every":  # its own table (`render_join`)
            continue
        runs = agent_rows(setting, out)
        sync = synchronous_of(matrix, setting)
        sync_runs = agent_rows(sync, out) if sync is not None else {}
        for i, agent in enumerate(setting.agent_ids):
            finals = {s: v for s, a in runs.items() if (v := final_accuracy(a[agent])) is not None}
            if not finals:
                continue
            base = {s: v for s, a in sync_runs.items() if (v := final_accuracy(a[agent])) is not None}
            diff = paired_difference(finals, base) if sync is not None and sync is not setting else None
            vs = "" if diff is None else (
                f"{diff.estimate.mean:+.3f}" + ("" if diff.estimate.half_width is None
                                                 else f" ± {diff.estimate.half_width:.3f}")
                + f" ({diff.positive}/{len(diff.seeds)})")
            trained = [staleness(a[agent]) for a in runs.values()]
            ratio = ""
            if i == 0 and sync_runs:
                ratios = []
                for seed, a in runs.items():
                    if seed in base and seed in sync_runs:
                        t = time_to(a[agent], base[seed])
                        ratios.append(None if t is None else t / end_time(sync_runs[seed][agent]))
                reached = [r for r in ratios if r is not None]
                ratio = _est(reached, 2) + (f" ({len(ratios) - len(reached)} never)" if len(reached) < len(ratios)
                                            else "")
            lines.append(f"| {setting.name} | {setting.run.max_staleness} | {agent} | {_est(list(finals.values()))} "
                         f"| {vs} | {_est([t for t, _ in trained], 0)} | {_est([s for _, s in trained], 2)} "
                         f"| {_est([idle_share(a[agent]) for a in runs.values()], 2)} | {ratio} |")
    return "\n".join(lines) + "\n" + render_join(matrix, out)


def _pm(diff) -> str:
    """A paired difference as "+0.010 ± 0.020 (3/5)"; "" for none."""
    if diff is None:
        return ""
    half = "" if diff.estimate.half_width is None else f" ± {diff.estimate.half_width:.3f}"
    return f"{diff.estimate.mean:+.3f}{half} ({diff.positive}/{len(diff.seeds)})"


def _span(values: Sequence[int]) -> str:
    return "" if not values else str(min(values)) if min(values) == max(values) else f"{min(values)}–{max(values)}"


def render_join(matrix: Matrix, out: Path) -> str:
    """The table of the settings with round_join "newest" (module docstring); "" when there are none."""
    lines = ["", "Settings in which a lab joins the newest round (`round_join = \"newest\"`), against the synchronous "
             "setting at the same speeds, at an equal number of each lab's own steps:", "",
             "| setting | K | agent | own steps | at own step | accuracy | vs K = 0 | final accuracy | trained "
             "| skipped | staleness | idle | run time | time to target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    found = False
    for setting in matrix.settings:
        sync = synchronous_of(matrix, setting)
        if setting.run.round_join == "every" or sync is None:
            continue
        runs, sync_runs = agent_rows(setting, out), agent_rows(sync, out)
        for i, agent in enumerate(setting.agent_ids):
            seeds = [s for s in runs if final_accuracy(runs[s][agent]) is not None]
            if not seeds:
                continue
            found = True
            steps, at, acc, base = [], [], {}, {}
            for seed in seeds:
                mine = runs[seed][agent]
                steps.append(max(own_step(r) for r in mine if r.get("final") is True))
                theirs = accuracy_at(sync_runs[seed][agent]) if seed in sync_runs else {}
                common = set(accuracy_at(mine)) & set(theirs)
                if common:
                    n = max(common)
                    at.append(n)
                    acc[seed], base[seed] = accuracy_at(mine)[n], theirs[n]
            finals = [final_accuracy(runs[s][agent]) for s in seeds]
            trained = [staleness(runs[s][agent]) for s in seeds]
            skipped = [sum(float(r.get("sim/skipped_samples", 0.0)) for r in runs[s][agent]) for s in seeds]
            run_time = [end_time(runs[s][agent]) / end_time(sync_runs[s][agent]) for s in seeds if s in sync_runs]
            ratio = ""
            if i == 0:
                targets = {s: final_accuracy(sync_runs[s][agent]) for s in seeds if s in sync_runs}
                ratios = [None if (t := time_to(runs[s][agent], v)) is None else t / end_time(sync_runs[s][agent])
                          for s, v in targets.items() if v is not None]
                reached = [r for r in ratios if r is not None]
                ratio = _est(reached, 2) + (f" ({len(ratios) - len(reached)} never)" if len(reached) < len(ratios)
                                            else "")
            lines.append(
                f"| {setting.name} | {setting.run.max_staleness} | {agent} | {_est([float(n) for n in steps], 1)} "
                f"| {_span(at)} | {_est(list(acc.values()))} | {_pm(paired_difference(acc, base))} "
                f"| {_est(finals)} | {_est([t for t, _ in trained], 0)} | {_est(skipped, 0)} "
                f"| {_est([s for _, s in trained], 2)} "
                f"| {_est([idle_share(runs[s][agent]) for s in seeds], 2)} | {_est(run_time, 2)} | {ratio} |")
    return "\n".join(lines) + "\n" if found else ""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--matrix", default="bench/staleness.toml", help="the matrix file (default: bench/staleness.toml)")
    p.add_argument("--out", default="runs/staleness", help="where `hacfed bench modes` wrote its runs")
    args = p.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix)
    except MatrixError as exc:
        print(f"staleness_table: {exc}", file=sys.stderr)
        return 2
    print(render(matrix, Path(args.out), f"python bench/staleness_table.py --matrix {args.matrix} --out {args.out}"),
          end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
