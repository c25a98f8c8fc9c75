"""Read the complete runs of a modes matrix back from their JSONL metrics files.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes --report-only

Per run and agent this keeps what the report needs: the final held-out accuracy (greedy, and sampled
pass@1 when the run evaluated it) from the `"final": true` row, the start accuracy from the round-0
evaluation row, and the learning curve (round -> greedy accuracy on every evaluation row).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hacfed.tools.experiments.matrix import Setting
from hacfed.tools.experiments.runner import is_complete, runs_of

Metric = Literal["accuracy", "pass1"]
# Per-source cross-sample statistics the update logs (`train/cross/SOURCE/STAT`, clients/update_metrics.py):
# the importance ratio's quantiles, the fraction of samples that carried gradient, the fraction with
# a positive advantage, and the fraction positive among those that carried gradient.
CROSS_STATS = ("ratio_p10", "ratio_p50", "ratio_p90", "grad_frac", "pos_frac", "grad_pos_frac")


@dataclass(frozen=True)
class AgentRun:
    final_accuracy: float
    final_pass1: float | None
    start_accuracy: float | None
    start_pass1: float | None
    curve: tuple[tuple[int, float], ...]  # (round, greedy accuracy), rounds ascending
    # Cross-sample diagnostics of the agent's updates, averaged over its training rows: source ->
    # statistic (CROSS_STATS) -> mean. Empty for modes that do not share.
    cross: dict[str, dict[str, float]] = field(default_factory=dict)
    # Greedy accuracy on each half of the task's mix (`eval_greedy/HALF`), at round 0 and after the
    # last update. Empty where the task has no halves or the run predates them.
    start_halves: dict[str, float] = field(default_factory=dict)
    final_halves: dict[str, float] = field(default_factory=dict)

    def final(self, metric: Metric) -> float | None:
        return self.final_accuracy if metric == "accuracy" else self.final_pass1

    def start(self, metric: Metric) -> float | None:
        return self.start_accuracy if metric == "accuracy" else self.start_pass1


@dataclass(frozen=True)
class SettingResults:
    setting: Setting
    runs: dict[tuple[str, int], dict[str, AgentRun]]  # (mode, seed) -> agent id -> its results
    expected: int  # how many runs the matrix asks for in this setting

    def by_seed(self, mode: str, agent: str, metric: Metric) -> dict[int, float]:
        """Seed -> final value, over the complete runs that have the metric."""
        out: dict[int, float] = {}
        for (m, seed), agents in self.runs.items():
            value = agents[agent].final(metric) if m == mode and agent in agents else None
            if value is not None:
                out[seed] = value
        return out

    def starts(self, agent: str, metric: Metric) -> list[float]:
        """Round-0 values of the agent over every complete run (all modes and seeds)."""
        return [v for agents in self.runs.values() if agent in agents
                for v in [agents[agent].start(metric)] if v is not None]

    def cross(self, mode: str, agent: str) -> dict[str, dict[str, float]]:
        """Source -> statistic -> mean over the seeds of `mode` (each seed's own mean over rounds)."""
        per_seed = [agents[agent].cross for (m, _seed), agents in self.runs.items() if m == mode and agent in agents]
        out: dict[str, dict[str, float]] = {}
        for source in sorted({src for seed in per_seed for src in seed}):
            for stat in CROSS_STATS:
                values = [seed[source][stat] for seed in per_seed if stat in seed.get(source, {})]
                if values:
                    out.setdefault(source, {})[stat] = sum(values) / len(values)
        return out

    def halves(self) -> tuple[str, ...]:
        """The halves of the task's mix that any run scored, sorted."""
        return tuple(sorted({h for agents in self.runs.values() for run in agents.values() for h in run.final_halves}))

    def half_by_seed(self, mode: str, agent: str, half: str) -> dict[int, float]:
        """Seed -> final greedy accuracy on one half of the mix, over the runs that scored it."""
        return {seed: agents[agent].final_halves[half] for (m, seed), agents in self.runs.items()
                if m == mode and agent in agents and half in agents[agent].final_halves}

    def half_starts(self, agent: str, half: str) -> list[float]:
        return [agents[agent].start_halves[half] for agents in self.runs.values()
                if agent in agents and half in agents[agent].start_halves]

    def curve(self, mode: str, agent: str) -> dict[int, list[float]]:
        """Round -> greedy accuracies over the seeds of `mode`."""
        out: dict[int, list[float]] = {}
        for (m, _seed), agents in sorted(self.runs.items()):
            if m == mode and agent in agents:
                for rnd, acc in agents[agent].curve:
                    out.setdefault(rnd, []).append(acc)
        return dict(sorted(out.items()))


def parse_agent_runs(rows: Sequence[dict], agent_ids: Sequence[str]) -> dict[str, AgentRun]:
    """Rows of one metrics file -> one `AgentRun` per agent that has a final row."""
    out: dict[str, AgentRun] = {}
    for agent in agent_ids:
        mine = [r for r in rows if r.get("agent") == agent]
        finals = [r for r in mine if r.get("final") is True]
        if not finals:
            continue
        final = finals[-1]
        evals = [r for r in mine if r.get("eval_accuracy") is not None and r.get("final") is not True]
        start = next((r for r in evals if r.get("round") == 0), None)
        curve = {int(r["round"]): float(r["eval_accuracy"]) for r in evals}
        curve[int(final["round"])] = float(final["eval_accuracy"])  # after the last update
        out[agent] = AgentRun(
            final_accuracy=float(final["eval_accuracy"]),
            final_pass1=_float_or_none(final.get("eval_pass1")),
            start_accuracy=_float_or_none(start.get("eval_accuracy")) if start else None,
            start_pass1=_float_or_none(start.get("eval_pass1")) if start else None,
            curve=tuple(sorted(curve.items())),
            cross=cross_means(mine),
            start_halves=_halves(start) if start else {},
            final_halves=_halves(final),
        )
    return out


def _halves(row: dict) -> dict[str, float]:
    """`eval_greedy/HALF` keys of an evaluation row -> {HALF: accuracy}."""
    out: dict[str, float] = {}
    for key, value in row.items():
        number = _float_or_none(value)
        if key.startswith("eval_greedy/") and number is not None:
            out[key.removeprefix("eval_greedy/")] = number
    return out


def cross_means(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Source -> statistic -> mean over the rows that logged it (`train/cross/SOURCE/STAT`)."""
    sums: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        for key, value in row.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[:2] == ["train", "cross"] and parts[3] in CROSS_STATS:
                number = _float_or_none(value)
                if number is not None:
                    sums.setdefault((parts[2], parts[3]), []).append(number)
    out: dict[str, dict[str, float]] = {}
    for (source, stat), values in sorted(sums.items()):
        out.setdefault(source, {})[stat] = sum(values) / len(values)
    return out


def load_setting(setting: Setting, out: Path) -> SettingResults:
    """Every complete run of `setting` under `out` (incomplete ones are simply absent)."""
    runs: dict[tuple[str, int], dict[str, AgentRun]] = {}
    planned = runs_of(setting)
    for run in planned:
        if is_complete(run, out):
            path = run.metrics_path(out)
            try:
                rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not valid JSON Lines: {exc}") from None
            runs[(run.mode, run.seed)] = parse_agent_runs(rows, run.agent_ids)
    return SettingResults(setting, runs, len(planned))


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
