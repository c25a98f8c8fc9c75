"""bench/staleness_table.py: the labs-of-different-speeds table from paced runs' `sim/*` rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hacfed.tools.experiments.runner import plan_runs
from tests.unit.test_bench_modes import _matrix, _write_complete

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("staleness_table", ROOT / "bench" / "staleness_table.py")
staleness_table = importlib.util.module_from_spec(_spec)
sys.modules["staleness_table"] = staleness_table
_spec.loader.exec_module(staleness_table)

DEFAULTS = {"task": "add2", "rounds": 4, "lr": 5e-5, "eval_every": 2, "eval_problems": 50, "eval_split": "test",
            "prompts_per_round": 4, "group_size": 4, "seeds": [0, 1], "modes": ["xhacpo"], "baseline": "xhacpo"}


def _paced_rows(fast_curve, step_s, slow_final=0.4, stale=0.0):
    """Rows of a paced two-lab run: the fast lab evaluates after steps 2 and 4 (fast_curve), one step
    every step_s simulated seconds; the slow lab takes 40 s a step."""
    rows = []
    for step in range(1, 5):
        fast = {"round": step, "agent": "m1", "sim/finish_s": step * step_s, "sim/idle_s": 40 - step_s,
                "sim/trained_samples": 32.0, "sim/staleness_mean": stale}
        slow = {"round": step, "agent": "m2", "sim/finish_s": step * 40.0, "sim/idle_s": 0.0,
                "sim/trained_samples": 32.0, "sim/staleness_mean": 0.0}
        if step in (2, 4):
            fast["eval_accuracy"] = fast_curve[step // 2 - 1]
            slow["eval_accuracy"] = slow_final
        if step == 4:
            fast["final"] = slow["final"] = True
        rows += [fast, slow]
    return rows


def test_time_to_target_staleness_and_the_paired_difference(tmp_path):
    matrix = _matrix({"k0": {"agents": ["m1", "m2"], "lab_speed": ["m2=4"]},
                      "k1": {"agents": ["m1", "m2"], "lab_speed": ["m2=4"], "max_staleness": 1}}, DEFAULTS)
    for run in plan_runs(matrix):
        if run.setting == "k0":  # synchronous: the fast lab waits for the slow one, final 0.5 at 160 s
            rows = _paced_rows((0.45, 0.5), 40.0)
        else:  # K = 1: it reaches 0.5 at its second evaluation, step 2 of 20 s steps = 40 s, and ends at 0.55
            rows = _paced_rows((0.5, 0.55), 20.0, stale=0.5)
        _write_complete(run, tmp_path, rows)
    text = staleness_table.render(matrix, tmp_path, "cmd")
    assert "| k1 | 1 | m1 | 0.550 ± 0.000 | +0.050 ± 0.000 (2/2) | 128 ± 0 | 0.50 ± 0.00 |" in text
    assert text.rstrip().split("\n")[-2].endswith("| 0.25 ± 0.00 |")  # 40 s of the synchronous 160 s
    assert "| k0 | 0 | m1 | 0.500 ± 0.000 |  |" in text


def test_a_lab_that_never_reaches_the_target_is_counted_as_never():
    rows = _paced_rows((0.3, 0.4), 20.0)
    assert staleness_table.time_to([r for r in rows if r["agent"] == "m1"], 0.5) is None
    assert staleness_table.time_to([r for r in rows if r["agent"] == "m1"], 0.4) == pytest.approx(80.0)


def test_the_shipped_matrix_runs_the_issue_speeds_and_bounds():
    matrix = staleness_table.load_matrix(ROOT / "bench" / "staleness.toml")
    assert {(s.run.lab_speed, s.run.max_staleness, s.run.round_join) for s in matrix.settings} == {
        (("chain-qwen2=4",), 0, "every"), (("chain-qwen2=4",), 1, "every"), (("chain-qwen2=4",), 2, "every"),
        (("chain-qwen2=1",), 1, "every"), (("chain-qwen2=4",), 5, "newest")}
    assert staleness_table.synchronous_of(matrix, matrix.setting("speed4-k2")).name == "speed4-k0"
    join = matrix.setting("speed4-join")
    assert staleness_table.synchronous_of(matrix, join).name == "speed4-k0"
    assert (join.run.rounds, join.run.eval_every, join.run.eval_problems) == (52, 5, 500)
    assert matrix.setting("speed4-k0").run.rounds == 20


def _joined_rows(fast_curve, slow_curve, fast_step_s=10.0):
    """Rows of a paced two-lab run with round_join "newest" over 8 rounds: the fast lab m1 takes every
    round (one every fast_step_s simulated seconds) and evaluates at own steps 2, 4, 6 and its final
    update (8); the slow lab m2 takes rounds 0 and 4 (40 s each) and evaluates at own step 0 and its
    final update (2)."""
    rows = []
    for step in range(9):
        row = {"round": step, "agent": "m1", "sim/own_step": step, "sim/finish_s": (step + 1) * fast_step_s,
               "sim/idle_s": 0.0, "sim/trained_samples": 16.0, "sim/staleness_mean": 1.0}
        if step in (2, 4, 6, 8):
            row["eval_accuracy"] = fast_curve[step // 2 - 1]
        rows.append({**row, "final": True} if step == 8 else row)
    for own, round_id in enumerate((0, 4, 8)):
        row = {"round": round_id, "agent": "m2", "sim/own_step": own, "sim/finish_s": (own + 1) * 40.0,
               "sim/skipped_samples": 48.0 if own else 0.0, "sim/idle_s": 0.0, "sim/trained_samples": 64.0,
               "sim/staleness_mean": 2.0}
        if own in (0, 2):
            row["eval_accuracy"] = slow_curve[own // 2]
        rows.append({**row, "final": True} if own == 2 else row)
    return rows


def test_the_joined_setting_compares_each_lab_at_an_equal_number_of_its_own_steps(tmp_path):
    matrix = _matrix({"k0": {"agents": ["m1", "m2"], "lab_speed": ["m2=4"]},
                      "join": {"agents": ["m1", "m2"], "lab_speed": ["m2=4"], "max_staleness": 3,
                               "round_join": "newest", "rounds": 8}}, DEFAULTS)
    for run in plan_runs(matrix):
        if run.setting == "k0":  # own steps = rounds; evaluations at 2 and 4 (final), 160 s
            rows = _paced_rows((0.45, 0.5), 40.0, slow_final=0.4)
        else:  # the fast lab reaches 0.5 at own step 4, finishing at 50 s; the slow lab ends at 0.35
            rows = _joined_rows((0.48, 0.5 if run.seed == 0 else 0.52, 0.56, 0.6), (0.1, 0.35))
        _write_complete(run, tmp_path, rows)
    text = staleness_table.render(matrix, tmp_path, "cmd")
    assert "| join |" not in text.split("Settings in which")[0]  # not in the first table
    # m1: 8 own steps; at own step 4 (the synchronous final) 0.5 and 0.52 against 0.5: +0.010; its run
    # ends at 90 s of the synchronous 160 s; it first reaches 0.5 at own step 4, at 50 s.
    assert ("| join | 3 | m1 | 8.0 ± 0.0 | 4 | 0.510 ± 0.127 | +0.010 ± 0.127 (1/2) | 0.600 ± 0.000 | 144 ± 0 "
            "| 0 ± 0 | 1.00 ± 0.00 | 0.00 ± 0.00 | 0.56 ± 0.00 | 0.31 ± 0.00 |") in text
    # m2: 2 own steps; at own step 2 (its final) 0.35 against the synchronous 0.4 at round 2.
    assert ("| join | 3 | m2 | 2.0 ± 0.0 | 2 | 0.350 ± 0.000 | -0.050 ± 0.000 (0/2) | 0.350 ± 0.000 | 192 ± 0 "
            "| 96 ± 0 | 2.00 ± 0.00 | 0.00 ± 0.00 | 0.75 ± 0.00 |  |") in text
    assert staleness_table.render_join(_matrix({"k0": {"agents": ["m1", "m2"]}}, DEFAULTS), tmp_path) == ""
