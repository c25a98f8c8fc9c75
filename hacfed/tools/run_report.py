"""`hacfed report RUN_DIR`: what one run's files say, as plain data for the charts.

    data = load_run(Path("state/coordinator"))      # or a sim output dir, a demo's runs/, a lab's state dir
    data.agents, data.rejections["lab-a"]           # ['lab-a', 'lab-b'], Counter({'HACFED-E-REWARD-MISMATCH': 4})

Every run writes the same JSON Lines rows (docs/experiments.md "The metrics file"): `hacfed sim --metrics-out`,
`hacfed demo --metrics-out` (default `runs/demo-metrics.jsonl`), a coordinator's
`STATE/metrics.jsonl`, and a lab's own `STATE/metrics.jsonl` (hacfed.metrics_sinks). Why a
trajectory was rejected is only in the coordinator's journal (`journal.sqlite`, table
`rejections`), which is opened read-only when it is found beside the metrics. Nothing of the run
is modified.

Everything below `load_run` is a pure function over rows, so the charts and their tests need no run.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hacfed.capability import capability_ratio
from hacfed.hacpo_config import HacpoConfig

METRICS_FILE = "metrics.jsonl"
JOURNAL_FILE = "journal.sqlite"
CROSS_PREFIX = "train/cross/"
QUANTILES = ("ratio_p10", "ratio_p50", "ratio_p90")  # what clients/update_metrics.py summarize_cross logs per source


class NoMetrics(ValueError):
    """The path holds no metrics file hacfed wrote (or only empty ones)."""


@dataclass(frozen=True)
class RunSources:
    metrics: tuple[Path, ...]  # one file, or a lab's file per subdirectory (merged)
    journal: Path | None


@dataclass(frozen=True)
class RunData:
    rows: tuple[dict[str, Any], ...]
    sources: RunSources
    # participant -> code -> count: rejected trajectories, and refused whole submissions (no seq)
    rejections: Mapping[str, Counter] = field(default_factory=dict)
    refusals: Mapping[str, Counter] = field(default_factory=dict)

    @property
    def agents(self) -> list[str]:
        return sorted({str(r["agent"]) for r in self.rows})

    @property
    def modes(self) -> list[str]:
        return sorted({str(r["mode"]) for r in self.rows if r.get("mode")})


# -- finding and reading the files ----------------------------------------------------------------


def find_sources(path: Path) -> RunSources:
    """Which metrics file(s) and journal a path means (see the module docstring); NoMetrics if none."""
    path = Path(path)
    if not path.exists():
        raise NoMetrics(f"{path} does not exist")
    if path.is_file():
        return RunSources((path,), _find_journal([path.parent]))
    candidates = [path / METRICS_FILE, path / "coordinator" / METRICS_FILE]
    for candidate in candidates:
        if candidate.is_file():
            return RunSources((candidate,), _find_journal([candidate.parent, path]))
    top = sorted(p for p in path.glob("*.jsonl") if p.is_file())
    if len(top) == 1:
        return RunSources((top[0],), _find_journal([path]))
    if len(top) > 1:
        raise NoMetrics(f"{path} holds several metrics files ({', '.join(p.name for p in top)}); "
                        f"pass one of them as RUN_DIR")
    labs = sorted(p for p in path.glob(f"*/{METRICS_FILE}") if p.is_file())
    if labs:  # a folder of labs' state dirs: each lab's own rows
        return RunSources(tuple(labs), _find_journal([path]))
    raise NoMetrics(f"no metrics in {path}: expected {METRICS_FILE} (a coordinator's or a lab's state dir), "
                    f"coordinator/{METRICS_FILE}, or one *.jsonl file (hacfed sim --metrics-out, hacfed demo)")


def _find_journal(dirs: Iterable[Path]) -> Path | None:
    for d in dirs:
        for candidate in (d / JOURNAL_FILE, d / "coordinator" / JOURNAL_FILE, *sorted(d.glob(f"*/{JOURNAL_FILE}"))):
            if candidate.is_file():
                return candidate
    return None


def read_rows(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The rows of the files, in order; a torn last line (a crash mid-write) is skipped, and a round
    written twice (a restarted writer) keeps its last row."""
    latest: dict[tuple[str, int, bool], dict[str, Any]] = {}
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("round"), int) or "agent" not in row:
                continue
            latest[(str(row["agent"]), row["round"], bool(row.get("final")))] = row
    return sorted(latest.values(), key=lambda r: (r["round"], bool(r.get("final")), str(r["agent"])))


def read_rejections(journal: Path) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """(rejected trajectories, refused submissions) per participant and code, from the journal's
    `rejections` table, opened read-only (a running coordinator is not disturbed)."""
    uri = f"file:{journal.resolve().as_posix()}?mode=ro"
    rejected: dict[str, Counter] = {}
    refused: dict[str, Counter] = {}
    try:
        with sqlite3.connect(uri, uri=True, timeout=5.0) as db:
            rows = db.execute("SELECT participant_id, code, submission_seq IS NOT NULL, COUNT(*) FROM rejections "
                              "GROUP BY participant_id, code, submission_seq IS NOT NULL").fetchall()
    except sqlite3.Error as exc:
        raise ValueError(f"cannot read the rejections of the journal {journal}: {exc}") from None
    for pid, code, in_submission, n in rows:
        target = rejected if in_submission else refused
        target.setdefault(pid or "(unknown sender)", Counter())[str(code)] += int(n)
    return rejected, refused


def load_run(path: Path) -> RunData:
    sources = find_sources(path)
    rows = read_rows(sources.metrics)
    if not rows:
        raise NoMetrics(f"no metrics rows in {', '.join(str(p) for p in sources.metrics)} (empty, or not hacfed's "
                        f"JSON Lines format: one object per agent per round with 'round' and 'agent')")
    rejected, refused = read_rejections(sources.journal) if sources.journal else ({}, {})
    return RunData(tuple(rows), sources, rejected, refused)


# -- pure derivations ------------------------------------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


# What the charts draw: beyond these, matplotlib's tick and transform code fails ("Singular matrix",
# "arange: cannot compute length") on values a lab can log. Ratios span many decades legitimately.
PLOT_MAX_ABS = 1e12
PLOT_LOG_RANGE = (1e-30, 1e30)


def plottable(points: Sequence[tuple[int, float]], *, log: bool) -> tuple[list[tuple[int, float]], int]:
    """The points a chart can draw (finite, within PLOT_MAX_ABS, or PLOT_LOG_RANGE on a log axis)
    and how many were left out."""
    low, high = PLOT_LOG_RANGE if log else (-PLOT_MAX_ABS, PLOT_MAX_ABS)
    kept = [(x, y) for x, y in points if math.isfinite(y) and low <= y <= high]
    return kept, len(points) - len(kept)


def series(rows: Sequence[Mapping[str, Any]], agent: str, key: str, *, final: bool = False) -> list[tuple[int, float]]:
    """(round, value) of `key` for `agent`; the final row (after the last pool) only with final=True."""
    out = []
    for r in rows:
        if r["agent"] != agent or (r.get("final") and not final):
            continue
        value = _number(r.get(key))
        if value is not None:
            out.append((int(r["round"]), value))
    return out


def capability_ratios(rows: Sequence[Mapping[str, Any]], agents: Sequence[str],
                      cfg: HacpoConfig | None = None) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(learner, source) -> (round, ω) with ω = clip(P̂_source / P̂_learner) as hacfed.capability
    computes it (Eq. 10), from the P̂ each row logged; the clip bounds are HacpoConfig's defaults,
    since a metrics file does not carry the run's settings."""
    cfg = cfg or HacpoConfig()
    by_round: dict[int, dict[str, float]] = {}
    for r in rows:
        value = _number(r.get("capability"))
        if value is not None and value > 0 and not r.get("final"):
            by_round.setdefault(int(r["round"]), {})[str(r["agent"])] = value
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for rnd in sorted(by_round):
        caps = by_round[rnd]
        for learner in agents:
            for source in agents:
                if learner != source and learner in caps and source in caps:
                    out.setdefault((learner, source), []).append((rnd, capability_ratio(caps, source, learner, cfg)))
    return out


def cross_stats(rows: Sequence[Mapping[str, Any]], agent: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """source -> statistic -> (round, value) from `train/cross/SOURCE/STAT` of `agent`'s rows: how its
    update at that round used each source's samples."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r in rows:
        if r["agent"] != agent:
            continue
        for key, raw in r.items():
            if not key.startswith(CROSS_PREFIX):
                continue
            source, _, stat = key[len(CROSS_PREFIX):].rpartition("/")
            value = _number(raw)
            if source and value is not None:
                out.setdefault(source, {}).setdefault(stat, []).append((int(r["round"]), value))
    return out


def ratio_quantile_samples(rows: Sequence[Mapping[str, Any]], agent: str) -> dict[str, dict[str, list[float]]]:
    """source -> quantile name -> every round's value: the data of the cross-ratio histogram. The
    update logs three quantiles of each round's per-sample ratios, not the samples themselves."""
    return {source: {q: [v for _, v in stats[q]] for q in QUANTILES if stats.get(q)}
            for source, stats in cross_stats(rows, agent).items()
            if any(stats.get(q) for q in QUANTILES)}


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """agent -> (accepted, rejected) trajectories over the run (the metrics' per-round counts)."""
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r.get("final"):
            continue
        a, j = out.get(str(r["agent"]), (0, 0))
        out[str(r["agent"])] = (a + int(_number(r.get("accepted")) or 0), j + int(_number(r.get("rejected")) or 0))
    return out


def accuracy_change(rows: Sequence[Mapping[str, Any]], agent: str) -> tuple[float, float] | None:
    """(first, last) held-out accuracy of `agent`, the final evaluation included."""
    points = series(rows, agent, "eval_accuracy", final=True)
    return (points[0][1], points[-1][1]) if points else None
