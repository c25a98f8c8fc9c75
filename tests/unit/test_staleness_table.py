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
    assert {(s.run.lab_speed, s.run.max_staleness) for s in matrix.settings} == {
        (("chain-qwen2=4",), 0), (("chain-qwen2=4",), 1), (("chain-qwen2=4",), 2), (("chain-qwen2=1",), 1)}
    assert staleness_table.synchronous_of(matrix, matrix.setting("speed4-k2")).name == "speed4-k0"
