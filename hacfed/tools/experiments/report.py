"""Markdown report of a modes matrix, written between markers into docs/results.md.

    hacfed bench modes --matrix bench/modes.toml --out runs/modes --report-only

The section between `<!-- BEGIN hacfed bench modes -->` and `<!-- END hacfed bench modes -->` is
regenerated from the complete runs on disk (the rest of the file is never touched; the markers are
appended when absent). Per setting: the command that regenerates it, final greedy accuracy and
sampled pass@1 per agent × mode (mean ± 95 % CI over seeds), paired differences against the
baseline, the best non-baseline mode, and a learning-curve PNG. A result that another generated page
beside this one prints from the same runs (or from more seeds of them) is left out, with a line that
links to it (`pages.py`), so no result is printed on two pages.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hacfed.tools.experiments.curves import plot_setting
from hacfed.tools.experiments.matrix import Comparison, Matrix, Setting
from hacfed.tools.experiments.pages import (
    COMPARISONS_TITLE,
    Elsewhere,
    Page,
    Placement,
    command_options,
    placement,
    sibling_pages,
)
from hacfed.tools.experiments.results import Metric, SettingResults, load_setting
from hacfed.tools.experiments.stats import Estimate, PairedDifference, mean_ci, paired_difference

BEGIN = "<!-- BEGIN hacfed bench modes -->"
END = "<!-- END hacfed bench modes -->"
METRIC_NAMES: dict[Metric, str] = {"accuracy": "greedy accuracy", "pass1": "sampled pass@1"}
DASH = "–"
COMPARISONS = "\0comparisons"  # previous_blocks' key for that block (no setting name can be it)
KEPT_PREFIX = "*Not regenerated:"
KEPT_MARKS = (KEPT_PREFIX, "*Kept from the previous report:")  # the second: the same mark in its older wording


class NothingToReport(ValueError):
    """No setting of the matrix has a single complete run on disk."""


@dataclass(frozen=True)
class ReportPaths:
    results_md: Path  # the markdown file holding the generated section
    img_dir: Path  # where the learning-curve PNGs go
    command: str  # `hacfed bench modes ...` as the user should retype it (without --only)


def write_report(matrix: Matrix, out: Path, paths: ReportPaths) -> list[Path]:
    """Load every setting's complete runs, plot them and rewrite the section; returns files written."""
    all_results = {s.name: load_setting(s, Path(out)) for s in matrix.settings}
    if not any(r.runs for r in all_results.values()):
        raise NothingToReport(f"no complete runs under {out} for {matrix.path}; nothing to report")
    here = Page(paths.results_md, matrix, "--results" in (command_options(paths.command) or {}))
    placed = placement(here, sibling_pages(paths.results_md, paths.command, out))
    written: list[Path] = []
    images: dict[str, str] = {}
    for name, results in all_results.items():
        if results.runs and not _all_elsewhere(results.setting, placed):
            png = plot_setting(results, paths.img_dir / f"modes-{name}.png")
            written.append(png)
            images[name] = Path(os.path.relpath(png, paths.results_md.parent)).as_posix()
    old = paths.results_md.read_text(encoding="utf-8") if paths.results_md.exists() else ""
    section = render(matrix, all_results, images, paths.command, out, kept=previous_blocks(old), placed=placed)
    paths.results_md.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.results_md.with_name(paths.results_md.name + ".tmp")
    tmp.write_text(replace_section(old, section, paths.results_md), encoding="utf-8")
    os.replace(tmp, paths.results_md)
    return [paths.results_md, *written]


def replace_section(document: str, section: str, where: Path | str = "results file") -> str:
    """`document` with the text between the markers replaced by `section` (markers appended if absent)."""
    block = f"{BEGIN}\n{section.strip()}\n{END}"
    has_begin, has_end = document.count(BEGIN), document.count(END)
    if has_begin == has_end == 0:
        return (document.rstrip("\n") + "\n\n" if document.strip() else "") + block + "\n"
    if has_begin != 1 or has_end != 1 or document.index(BEGIN) > document.index(END):
        raise ValueError(f"{where}: expected one {BEGIN!r} followed by one {END!r}; fix the markers by hand")
    head, rest = document.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def previous_blocks(document: str) -> dict[str, list[str]]:
    """The generated section's blocks in `document`, by setting name (and COMPARISONS), each from its
    `### ` heading to the line before the next one; {} when the document has no generated section."""
    if document.count(BEGIN) != 1 or document.count(END) != 1 or document.index(BEGIN) > document.index(END):
        return {}
    section = document.split(BEGIN, 1)[1].split(END, 1)[0]
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in section.strip("\n").splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
            name = COMPARISONS if heading == COMPARISONS_TITLE else heading.split(":", 1)[0].strip()
            current = blocks.setdefault(name, [])
            current.clear()  # a name twice: the last block wins
        if current is not None:
            current.append(line)
    return {name: _strip_blank(lines) for name, lines in blocks.items()}


def kept_block(block: Sequence[str], out: Path, what: str = "this setting") -> list[str]:
    """The block the section held, marked (once) as carried over, for a setting with no runs on disk."""
    lines = list(block)
    if not any(line.startswith(KEPT_MARKS) for line in lines):
        lines[1:1] = ["", f"{KEPT_PREFIX} no complete run of {what} was under `{out}` when this section "
                          "was written, so this block is carried over unchanged.*"]
    return lines


def _strip_blank(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def render(matrix: Matrix, all_results: dict[str, SettingResults], images: dict[str, str], command: str,
           out: Path, kept: dict[str, list[str]] | None = None, placed: Placement | None = None) -> str:
    """The generated section. A setting with no complete run under `out` whose block is in `kept` (the
    previous report's, `previous_blocks`) keeps that block, marked; likewise the comparisons when one
    of their settings has no runs. So a machine that holds only some settings' runs (a fresh clone
    that reran one setting) regenerates those and loses nothing of the others. What `placed` says
    another page prints is left out, with a link; a setting left out whole needs no runs here."""
    kept = kept or {}
    placed = placed or Placement()
    lines = [
        "## Modes benchmark (generated)",
        "",
        f"Generated by `{command}` from the runs under `{out}`; edit `{matrix.path}`, not this section. "
        "Accuracies are held-out accuracy after the last update (the `\"final\": true` row): greedy decoding, "
        "and sampled pass@1 (one temperature-1 sample per problem). Cells are mean ± 95 % Student-t CI "
        "over seeds (n = seeds). Differences are paired per seed (same prompt plans and starting models); "
        "**bold**: the CI lies entirely above 0. A result that another generated page prints from the same "
        "runs, or from more seeds of them, is not repeated here; a line links to it.",
    ]
    for name, results in all_results.items():
        only = f"{command} --only {name}"
        elsewhere = placed.modes.get(name, {})
        if _all_elsewhere(results.setting, placed):
            lines += ["", *_setting_intro(results.setting, only), "", *_elsewhere_modes(results.setting, elsewhere)]
        elif not results.runs and name in kept:
            lines += ["", *kept_block(kept[name], out)]
        else:
            lines += ["", *setting_section(results, only, images.get(name), out, elsewhere)]
    if matrix.comparisons:
        shown = [c for c in matrix.comparisons if c not in placed.comparisons]
        compared = {name for c in shown for name in c.settings}
        if shown and COMPARISONS in kept and any(not all_results[name].runs for name in compared):
            lines += ["", *kept_block(kept[COMPARISONS], out, "some of these settings")]
        else:
            lines += ["", *comparisons_section(shown, all_results, placed.comparisons)]
    return "\n".join(lines)


def _all_elsewhere(setting: Setting, placed: Placement) -> bool:
    return set(placed.modes.get(setting.name, {})) >= set(setting.run.modes)


def not_repeated(labels_by_place: dict[Elsewhere, list[str]], what: str) -> list[str]:
    """One line per other page: what this page leaves out, and where that page prints it."""
    lines = []
    for where, labels in labels_by_place.items():
        listed = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"
        how = (f"over seeds {', '.join(map(str, where.seeds))}, which include these runs" if where.more_seeds
               else "from the same runs")
        lines += [f"Not repeated here: {listed}{what}; [{where.page}]({where.link}) prints "
                  f"{'it' if len(labels) == 1 else 'them'} {how}.", ""]
    return lines[:-1]


def _elsewhere_modes(setting: Setting, elsewhere: dict[str, Elsewhere]) -> list[str]:
    by_place: dict[Elsewhere, list[str]] = {}
    for mode in setting.run.modes:
        if mode in elsewhere:
            label = f"{mode} (baseline)" if mode == setting.run.baseline else mode
            by_place.setdefault(elsewhere[mode], []).append(label)
    return not_repeated(by_place, " of this setting")


def _setting_intro(s: Setting, command: str, runs: str = "") -> list[str]:
    r = s.run
    return [
        f"### {s.name}" + (f": {s.description}" if s.description else ""), "",
        f"Agents {', '.join(s.agents)}; task `{r.task}`, {r.rounds} rounds of {r.prompts_per_round} prompts × "
        f"G = {r.group_size}, lr {r.lr:g}, evaluation every {r.eval_every} rounds on {r.eval_problems} "
        f"`{r.eval_split}` problems; seeds {', '.join(map(str, r.seeds))}.{runs}", "",
        "```bash", command, "```",
    ]


def setting_section(results: SettingResults, command: str, image: str | None, out: Path,
                    elsewhere: dict[str, Elsewhere] | None = None) -> list[str]:
    """A setting's block; the modes in `elsewhere` (printed by another page) are left out, with a link."""
    s, r = results.setting, results.setting.run
    elsewhere = elsewhere or {}
    lines = _setting_intro(s, command, f" Complete runs: {len(results.runs)} of {results.expected}.")
    if elsewhere:
        lines += ["", *_elsewhere_modes(s, elsewhere)]
    if not results.runs:
        return lines + ["", f"No complete runs yet under `{Path(out) / s.name}`."]
    shown = tuple(m for m in r.modes if m not in elsewhere)
    for metric in ("accuracy", "pass1"):
        lines += ["", f"Final {METRIC_NAMES[metric]}:", "", *_values_table(results, metric, shown)]
    if any(m != r.baseline for m in shown):
        for metric in ("accuracy", "pass1"):
            lines += ["", f"Paired difference mode − {r.baseline}, final {METRIC_NAMES[metric]} "
                      "(k/n: seeds where the difference is > 0):", "", *_difference_table(results, metric, shown)]
        lines += ["", best_mode_line(results)]
    halves = _halves_table(results, shown)
    if halves:
        lines += ["", "Final greedy accuracy on each half of the task's mix (which half an agent learnt), "
                  f"and the paired difference against {r.baseline} ({DASH}: no run of that mode scored the halves):",
                  "", *halves]
    diagnostics = _diagnostics_table(results, shown)
    if diagnostics:
        lines += ["", "How each learner used the other agents' samples (mean over training rounds, then seeds): "
                  "the importance ratio's 10th/50th/90th percentile, the fraction of cross samples that "
                  "carried gradient, the fraction with a positive advantage, and the fraction positive "
                  "among those that carried gradient:", "", *diagnostics]
    if image:
        lines += ["", f"![learning curves of {s.name}]({image})"]
    return lines


def _values_table(results: SettingResults, metric: Metric, shown: Sequence[str]) -> list[str]:
    s, r = results.setting, results.setting.run
    header = ["mode", *(["rollouts/agent/round"] if metric == "accuracy" else []), *s.agent_ids]
    start = ["start (round 0)", *([DASH] if metric == "accuracy" else [])]
    start += [_start_cell(results.starts(agent, metric)) for agent in s.agent_ids]
    rows = [start]
    for mode in shown:
        label = f"{mode} (baseline)" if mode == r.baseline else mode
        cost = [str(r.rollouts_per_agent_per_round(mode))] if metric == "accuracy" else []
        cells = [format_estimate(_estimate(results.by_seed(mode, a, metric))) for a in s.agent_ids]
        rows.append([label, *cost, *cells])
    return markdown_table(header, rows)


def _difference_table(results: SettingResults, metric: Metric, shown: Sequence[str]) -> list[str]:
    s, r = results.setting, results.setting.run
    rows = []
    for mode in shown:
        if mode != r.baseline:
            diffs = [_paired(results, mode, a, metric) for a in s.agent_ids]
            rows.append([mode, *(format_difference(d) for d in diffs)])
    return markdown_table(["mode", *s.agent_ids], rows)


def _halves_table(results: SettingResults, shown: Sequence[str]) -> list[str]:
    s, r = results.setting, results.setting.run
    halves = results.halves()
    if not halves:
        return []
    columns = [(agent, half) for agent in s.agent_ids for half in halves]
    starts = [results.half_starts(agent, half) for agent, half in columns]
    rows = [["start (round 0)", *(_start_cell(v) for v in starts)]]
    for mode in shown:
        label = f"{mode} (baseline)" if mode == r.baseline else mode
        rows.append([label, *(format_estimate(_estimate(results.half_by_seed(mode, a, h))) for a, h in columns)])
    for mode in shown:
        if mode != r.baseline:
            diffs = [paired_difference(results.half_by_seed(mode, a, h), results.half_by_seed(r.baseline, a, h))
                     for a, h in columns]
            rows.append([f"{mode} − {r.baseline}", *(format_difference(d) for d in diffs)])
    return markdown_table(["mode", *(f"{a}: {h}" for a, h in columns)], rows)


def _diagnostics_table(results: SettingResults, shown: Sequence[str]) -> list[str]:
    s = results.setting
    rows = []
    for mode in shown:
        for agent in s.agent_ids:
            for source, stats in results.cross(mode, agent).items():
                quantiles = ("ratio_p10", "ratio_p50", "ratio_p90")
                ratio = "/".join(f"{stats[q]:.2f}" if q in stats else DASH for q in quantiles)
                fracs = [f"{stats[k]:.2f}" if k in stats else DASH for k in ("grad_frac", "pos_frac", "grad_pos_frac")]
                rows.append([mode, agent, source, ratio, *fracs])
    if not rows:
        return []
    return markdown_table(["mode", "learner", "source", "ratio p10/p50/p90", "carry gradient", "A > 0",
                           "A > 0 among carrying"], rows)


def best_mode_line(results: SettingResults) -> str:
    """The non-baseline mode with the highest greedy difference averaged over agents, and whom it beats."""
    s, r = results.setting, results.setting.run
    scored = []
    for mode in r.modes:
        diffs = {a: _paired(results, mode, a, "accuracy") for a in s.agent_ids}
        if mode != r.baseline and all(d is not None for d in diffs.values()):
            scored.append((sum(d.estimate.mean for d in diffs.values()) / len(diffs), mode, diffs))
    if not scored:
        return f"Best non-baseline mode: {DASH} (no mode has paired runs with {r.baseline} for every agent yet)."
    average, mode, diffs = max(scored, key=lambda t: t[0])
    beaten = [a for a, d in diffs.items() if d.estimate.above_zero]
    return (f"Best non-baseline mode by mean paired greedy-accuracy difference: **{mode}** ({average:+.3f} "
            f"averaged over agents); its CI lies above {r.baseline} for: {', '.join(beaten) or 'no agent'}"
            f" ({len(beaten)} of {len(diffs)} agents).")


def comparisons_section(comparisons: Sequence[Comparison], all_results: dict[str, SettingResults],
                        elsewhere: dict[Comparison, Elsewhere] | None = None) -> list[str]:
    """The comparisons table; those in `elsewhere` (printed by another page) are left out, with a link."""
    by_place: dict[Elsewhere, list[str]] = {}
    for c, where in (elsewhere or {}).items():
        by_place.setdefault(where, []).append(f"{c.agent} {c.mode} {c.settings[0]} vs {c.settings[1]}")
    lines = [f"### {COMPARISONS_TITLE}", "", "The same agent and mode in two settings A and B, final accuracy "
             "paired by seed.", *(["", *not_repeated(by_place, "")] if by_place else [])]
    if not comparisons:
        return lines
    rows = []
    for c in comparisons:
        first, second = all_results[c.settings[0]], all_results[c.settings[1]]
        for metric in ("accuracy", "pass1"):
            a, b = first.by_seed(c.mode, c.agent, metric), second.by_seed(c.mode, c.agent, metric)
            rows.append([c.agent, c.mode, f"{c.settings[0]} vs {c.settings[1]}", METRIC_NAMES[metric],
                         format_estimate(_estimate(a)), format_estimate(_estimate(b)),
                         format_difference(paired_difference(a, b))])
    return [*lines, "", *markdown_table(["agent", "mode", "A vs B", "metric", "A", "B", "A − B (k/n > 0)"], rows)]


def format_estimate(e: Estimate | None) -> str:
    """`0.412 ± 0.021 (n=5)`; a single seed has no interval: `0.412 (n=1)`."""
    if e is None:
        return DASH
    ci = f" ± {e.half_width:.3f}" if e.half_width is not None else ""
    return f"{e.mean:.3f}{ci} (n={e.n})"


def format_difference(d: PairedDifference | None) -> str:
    """`**+0.030 ± 0.012** (5/5)`, bold when the CI lies entirely above 0."""
    if d is None:
        return DASH
    e = d.estimate
    mean = round(e.mean, 3) + 0.0  # + 0.0 turns a rounded -0.0 into 0.0: no "-0.000"
    text = f"{mean:+.3f}" + (f" ± {e.half_width:.3f}" if e.half_width is not None else "")
    return (f"**{text}**" if e.above_zero else text) + f" ({d.positive}/{e.n})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _start_cell(values: list[float]) -> str:
    if not values:
        return DASH
    mean = sum(values) / len(values)
    spread = max(values) - min(values)
    return f"{mean:.3f}" + (f" ({min(values):.3f}–{max(values):.3f})" if spread > 1e-9 else "")


def _estimate(values: dict[int, float]) -> Estimate | None:
    return mean_ci(list(values.values())) if values else None


def _paired(results: SettingResults, mode: str, agent: str, metric: Metric) -> PairedDifference | None:
    baseline = results.setting.run.baseline
    return paired_difference(results.by_seed(mode, agent, metric), results.by_seed(baseline, agent, metric))
