"""`hacfed bench modes`: the report's tables and comparisons, from synthetic runs on disk."""

from __future__ import annotations

import pytest

from hacfed.tools.experiments.report import BEGIN, END, ReportPaths, replace_section, write_report
from hacfed.tools.experiments.runner import plan_runs, runs_of
from tests.unit.test_bench_modes import DEFAULTS, _matrix, _rows, _write_complete

FINALS = {  # (mode, seed) -> final greedy accuracy of m1, m2
    ("naive", 0): (0.50, 0.30), ("naive", 1): (0.52, 0.30), ("naive", 2): (0.54, 0.36),
    ("gspo2", 0): (0.40, 0.32), ("gspo2", 1): (0.44, 0.31), ("gspo2", 2): (0.48, 0.30),
}


def _synthetic(out, matrix):
    for run in runs_of(matrix.setting("pair")):
        m1, m2 = FINALS[(run.mode, run.seed)]
        _write_complete(run, out, _rows(["m1", "m2"], run.mode, run.seed, {"m1": m1, "m2": m2},
                                        start={"m1": 0.35, "m2": 0.25}))


def test_report_tables_from_synthetic_runs(tmp_path):
    matrix = _matrix({"pair": {"agents": ["m1", "m2"], "description": "two toy agents"},
                      "later": {"agents": ["m1"]}},
                     comparisons=[{"agent": "m1", "mode": "naive", "settings": ["pair", "later"]}])
    out = tmp_path / "runs"
    _synthetic(out, matrix)
    results = tmp_path / "docs" / "results.md"
    results.parent.mkdir()
    results.write_text("# Results\n\nhand-written text\n")
    paths = ReportPaths(results, tmp_path / "docs" / "img", "hacfed bench modes --matrix m.toml --out runs")
    written = write_report(matrix, out, paths)
    png = tmp_path / "docs" / "img" / "modes-pair.png"
    assert written == [results, png] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    text = results.read_text()
    assert text.startswith("# Results\n\nhand-written text\n\n" + BEGIN) and text.endswith(END + "\n")
    assert "### pair: two toy agents" in text and "Complete runs: 6 of 6." in text
    assert "hacfed bench modes --matrix m.toml --out runs --only pair" in text
    # m1 naive: 0.50, 0.52, 0.54 -> 0.520 ± 4.3027·0.02/√3 = 0.050; gspo2: 0.40, 0.44, 0.48 -> 0.440 ± 0.099
    # m2 naive: 0.30, 0.30, 0.36 -> s² = 0.0024/2, s = 0.034641 -> 0.320 ± 4.3027·0.02 = 0.086
    assert "| start (round 0) | – | 0.350 | 0.250 |" in text
    assert "| naive | 128 | 0.520 ± 0.050 (n=3) | 0.320 ± 0.086 (n=3) |" in text
    assert "| gspo2 (baseline) | 256 | 0.440 ± 0.099 (n=3) | 0.310 ± 0.025 (n=3) |" in text
    # pass@1 is half the greedy accuracy in these files: m1 naive 0.260 ± 0.025
    assert "| naive | 0.260 ± 0.025 (n=3) | 0.160 ± 0.043 (n=3) |" in text
    # m1: diffs 0.10, 0.08, 0.06 -> +0.080 ± 0.050, all > 0 (bold: CI above 0)
    # m2: diffs -0.02, -0.01, 0.06 -> +0.010 ± 4.3027·0.043589/√3 = 0.108, 1 of 3 > 0
    assert "| naive | **+0.080 ± 0.050** (3/3) | +0.010 ± 0.108 (1/3) |" in text
    assert "**naive** (+0.045 averaged over agents); its CI lies above gspo2 for: m1 (1 of 2 agents)" in text
    assert "![learning curves of pair](img/modes-pair.png)" in text
    assert "### later" in text and "No complete runs yet under" in text
    assert "| m1 | naive | pair vs later | greedy accuracy | 0.520 ± 0.050 (n=3) | – | – |" in text
    # regenerating replaces the section instead of appending a second one
    results.write_text(results.read_text() + "\n## After\n")
    write_report(matrix, out, paths)
    again = results.read_text()
    assert again.count(BEGIN) == 1 and again.endswith("## After\n") and "hand-written text" in again


def _pair_and_later(tmp_path):
    """Two settings with complete runs (pair: FINALS; later: m1 naive 0.45, 0.50, 0.50) and one comparison."""
    matrix = _matrix({"pair": {"agents": ["m1", "m2"]}, "later": {"agents": ["m1"], "modes": ["naive"],
                                                                  "baseline": "naive"}},
                     comparisons=[{"agent": "m1", "mode": "naive", "settings": ["pair", "later"]}])
    out = tmp_path / "runs"
    _synthetic(out, matrix)
    for run, final in zip(runs_of(matrix.setting("later")), (0.45, 0.50, 0.50)):
        _write_complete(run, out, _rows(["m1"], "naive", run.seed, {"m1": final}))
    return matrix, out


def test_comparison_pairs_two_settings_by_seed(tmp_path):
    matrix, out = _pair_and_later(tmp_path)
    write_report(matrix, out, ReportPaths(tmp_path / "r.md", tmp_path / "img", "cmd"))
    text = (tmp_path / "r.md").read_text()
    # pair − later: 0.50−0.45, 0.52−0.50, 0.54−0.50 = 0.05, 0.02, 0.04 -> mean 0.036667
    # deviations 0.013333, -0.016667, 0.003333 -> s² = 0.00046667 / 2, s = 0.0152753
    # half-width 4.3027 · 0.0152753 / √3 = 0.037946 > mean: not bold; 3 of 3 > 0
    assert ("| m1 | naive | pair vs later | greedy accuracy | 0.520 ± 0.050 (n=3) | 0.483 ± 0.072 (n=3) "
            "| +0.037 ± 0.038 (3/3) |") in text
    # a setting with no mode but its baseline has no difference table
    assert text.count("Paired difference mode − gspo2, final greedy accuracy") == 1
    assert "Paired difference mode − naive" not in text


def test_a_setting_without_runs_keeps_its_previous_block(tmp_path):
    """A machine holding only some settings' runs regenerates those and keeps the others' earlier
    blocks (and the comparisons) verbatim, each marked once as kept."""
    matrix, out = _pair_and_later(tmp_path)
    paths = ReportPaths(tmp_path / "r.md", tmp_path / "img", "cmd")
    write_report(matrix, out, paths)
    first = paths.results_md.read_text()
    assert "| naive (baseline) | 128 | 0.483 ± 0.072 (n=3) |" in first and "Not regenerated" not in first
    # a fresh machine: later's runs are gone, pair's were rerun with other results
    for run in runs_of(matrix.setting("later")):
        run.metrics_path(out).unlink()
    FINALS_BEFORE = dict(FINALS)
    try:
        FINALS.update({("naive", 0): (0.60, 0.30)})
        _synthetic(out, matrix)
    finally:
        FINALS.clear()
        FINALS.update(FINALS_BEFORE)
    write_report(matrix, out, paths)
    second = paths.results_md.read_text()
    later = second.split("### later", 1)[1]
    assert later.splitlines()[2].startswith("*Not regenerated: no complete run of this setting was under")
    assert "| naive (baseline) | 128 | 0.483 ± 0.072 (n=3) |" in later  # the earlier numbers, unchanged
    assert "| pair vs later | greedy accuracy | 0.520 ± 0.050 (n=3) | 0.483 ± 0.072 (n=3)" in second  # kept too
    assert "| naive | 128 | 0.553 ±" in second  # pair regenerated from its new runs: (0.60+0.52+0.54)/3
    write_report(matrix, out, paths)  # kept twice: still one mark per block
    third = paths.results_md.read_text()
    assert third == second and third.count("Not regenerated") == 2
    assert "no complete run of some of these settings was under" in third
    # without an earlier block a setting with no runs says so, as before
    paths.results_md.write_text("# fresh\n")
    write_report(matrix, out, paths)
    assert "No complete runs yet under" in paths.results_md.read_text()


def test_a_kept_block_is_marked_once_in_either_wording():
    from pathlib import Path

    from hacfed.tools.experiments.report import kept_block

    block = ["### later", "", "text"]
    marked = kept_block(block, Path("runs"))
    assert marked[:3] == ["### later", "", "*Not regenerated: no complete run of this setting was under `runs` when "
                          "this section was written, so this block is carried over unchanged.*"]
    assert kept_block(marked, Path("runs")) == marked
    older = ["### later", "", "*Kept from the previous report: no complete run ...*", "", "text"]
    assert kept_block(older, Path("runs")) == older


def test_report_counts_incomplete_runs_and_single_seeds(tmp_path):
    matrix = _matrix()
    out = tmp_path / "runs"
    _synthetic(out, matrix)
    for run in runs_of(matrix.setting("pair")):
        if run.seed > 0 and run.mode == "naive":
            run.metrics_path(out).rename(run.partial_path(out))  # as if interrupted
    paths = ReportPaths(tmp_path / "r.md", tmp_path / "img", "cmd")
    write_report(matrix, out, paths)
    text = (tmp_path / "r.md").read_text()
    assert "Complete runs: 4 of 6." in text
    # one naive seed left: no interval; the paired difference uses seed 0 only: 0.50 − 0.40
    assert "| naive | 128 | 0.500 (n=1) | 0.300 (n=1) |" in text
    assert "| naive | +0.100 (1/1) | -0.020 (0/1) |" in text


def test_section_markers():
    assert replace_section("", "S") == f"{BEGIN}\nS\n{END}\n"
    doc = f"top\n{BEGIN}\nold\n{END}\nbottom\n"
    assert replace_section(doc, "new") == f"top\n{BEGIN}\nnew\n{END}\nbottom\n"
    for broken in (f"{BEGIN}\nx\n", f"{END}\n{BEGIN}\n", f"{BEGIN}{BEGIN}{END}"):
        with pytest.raises(ValueError, match="fix the markers by hand"):
            replace_section(broken, "new")


def test_cross_diagnostics_are_averaged_over_rounds_then_seeds_and_reported(tmp_path):
    from hacfed.tools.experiments.results import parse_agent_runs

    matrix = _matrix({"pair": {"agents": ["m1", "m2"]}}, defaults={**DEFAULTS, "seeds": [0, 1]})
    out = tmp_path / "runs"
    for run in plan_runs(matrix):
        rows = _rows(["m1", "m2"], run.mode, run.seed, {"m1": 0.5, "m2": 0.4})
        if run.mode == "naive":  # m1 learns from m2: grad_frac 0.2 and 0.4 (seed 0), 0.6 and 0.6 (seed 1)
            for row, frac in zip([r for r in rows if r["agent"] == "m1" and not r.get("final")][1:3],
                                 (0.2, 0.4) if run.seed == 0 else (0.6, 0.6)):
                row.update({"train/cross/m2/grad_frac": frac, "train/cross/m2/ratio_p10": 0.5,
                            "train/cross/m2/ratio_p50": 1.0, "train/cross/m2/ratio_p90": 1.5,
                            "train/cross/m2/pos_frac": 0.25, "train/cross/m2/grad_pos_frac": 1.0,
                            "train/cross/m2/unrelated": 7.0})
        _write_complete(run, out, rows)
    assert parse_agent_runs(_rows(["m1"], "naive", 0, {"m1": 0.5}), ["m1"])["m1"].cross == {}
    paths = ReportPaths(tmp_path / "results.md", tmp_path / "img", "hacfed bench modes --matrix m.toml --out runs")
    write_report(matrix, out, paths)
    text = paths.results_md.read_text()
    # seed means 0.3 and 0.6 -> 0.45; gspo2 shares nothing and m2 logged nothing: one row only
    assert "| naive | m1 | m2 | 0.50/1.00/1.50 | 0.45 | 0.25 | 1.00 |" in text
    assert text.count("| naive | m1 | m2 |") == 1 and "| gspo2 | m1 |" not in text


def test_halves_of_the_mix_are_tabled_per_agent_with_paired_differences(tmp_path):
    from hacfed.tools.experiments.results import parse_agent_runs

    matrix = _matrix({"pair": {"agents": ["m1", "m2"]}}, defaults={**DEFAULTS, "seeds": [0, 1]})
    out = tmp_path / "runs"
    for run in plan_runs(matrix):
        rows = _rows(["m1", "m2"], run.mode, run.seed, {"m1": 0.5, "m2": 0.4})
        for row in rows:
            if row.get("final"):  # naive: m1 reads "word" 0.3 better than gspo2 does, on both seeds
                word = 0.5 if run.mode == "naive" else 0.2 + 0.1 * run.seed
                row.update({"eval_greedy/sym": 0.6, "eval_greedy/word": word})
            elif row["round"] == 0 and "eval_accuracy" in row:
                row.update({"eval_greedy/sym": 0.4, "eval_greedy/word": 0.1})
        _write_complete(run, out, rows)
    first = parse_agent_runs(_rows(["m1"], "naive", 0, {"m1": 0.5}), ["m1"])["m1"]
    assert first.final_halves == {} and first.start_halves == {}  # runs without halves have none
    paths = ReportPaths(tmp_path / "results.md", tmp_path / "img", "hacfed bench modes --matrix m.toml --out runs")
    write_report(matrix, out, paths)
    text = paths.results_md.read_text()
    assert "| mode | m1: sym | m1: word | m2: sym | m2: word |" in text
    assert "| start (round 0) | 0.400 | 0.100 | 0.400 | 0.100 |" in text
    # word: naive 0.5 on both seeds, the baseline gspo2 0.2 and 0.3 -> +0.25 paired, for m1 and m2
    assert ("| naive − gspo2 | +0.000 ± 0.000 (0/2) | +0.250 ± 0.635 (2/2) | +0.000 ± 0.000 (0/2) "
            "| +0.250 ± 0.635 (2/2) |") in text
