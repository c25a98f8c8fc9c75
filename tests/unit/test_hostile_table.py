"""bench/hostile_table.py: the hostile-peers table from a matrix's runs (rows written in sim's format)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hacfed.tools.experiments.runner import plan_runs
from tests.unit.test_bench_modes import _matrix, _rows, _write_complete

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hostile_table", ROOT / "bench" / "hostile_table.py")
hostile_table = importlib.util.module_from_spec(_spec)
sys.modules["hostile_table"] = hostile_table  # dataclasses look their module up
_spec.loader.exec_module(hostile_table)

DEFAULTS = {"task": "add2", "rounds": 4, "lr": 5e-5, "eval_every": 4, "eval_problems": 50, "eval_split": "test",
            "prompts_per_round": 4, "group_size": 4, "seeds": [0, 1, 2], "modes": ["xhacpo"], "baseline": "xhacpo"}
ALONE = {0: {"m1": 0.50, "m2": 0.40}, 1: {"m1": 0.52, "m2": 0.42}, 2: {"m1": 0.54, "m2": 0.38}}



def test_the_table_pairs_each_agent_with_training_alone_and_the_honest_pair(tmp_path):
    matrix = _matrix({"honest": {"agents": ["m1", "m2"], "modes": ["gspo2", "xhacpo"], "baseline": "gspo2"},
                      "canary": {"agents": ["m1", "m2", "hostile:canary:x"]}}, DEFAULTS)
    honest = [r for r in plan_runs(matrix) if r.setting == "honest"]
    for run in honest:  # xhacpo in the honest pair: +0.02 over alone on every seed
        rows = _rows(["m1", "m2"], run.mode, run.seed,
                     {a: v + (0.02 if run.mode == "xhacpo" else 0.0) for a, v in ALONE[run.seed].items()})
        _write_complete(run, tmp_path, rows)
    for run in plan_runs(matrix, only=["canary"]):  # beside the canary lab: m1 −0.1 below alone, m2 equal to it
        rows = _rows(["m1", "m2"], run.mode, run.seed,
                     {"m1": ALONE[run.seed]["m1"] - 0.1, "m2": ALONE[run.seed]["m2"]})
        for row in rows:
            if row.get("final"):
                row["eval_canary_rate"] = 0.004
        rows += [{"round": r, "agent": "hostile-canary", "capability": 0.75} for r in range(4)]
        _write_complete(run, tmp_path, rows)

    rows = {(r.setting, r.agent): r for r in hostile_table.table_rows(matrix, tmp_path)}
    m1, m2 = rows[("canary", "m1")], rows[("canary", "m2")]
    assert m1.vs_alone.estimate.mean == pytest.approx(-0.1) and m1.vs_alone.positive == 0 and m1.safe is False
    assert m1.vs_honest.estimate.mean == pytest.approx(-0.12)
    assert m2.vs_alone.estimate.mean == pytest.approx(0.0, abs=1e-9) and m2.safe is True
    assert m1.canary_rate.mean == pytest.approx(0.004) and m1.bad_capability.mean == pytest.approx(0.75)
    text = hostile_table.render(matrix, tmp_path, "cmd")
    assert ("| canary | xhacpo | m1 | 0.420 ± 0.050 | **-0.100 ± 0.000** (0/3) | **-0.120 ± 0.000** (0/3) "
            "| **no** |") in text
    assert "0.40 %" in text and "| honest pair | xhacpo | m1 |" in text


def test_a_matrix_without_an_honest_setting_is_refused_by_name(tmp_path, capsys):
    path = tmp_path / "m.toml"
    path.write_text('[defaults]\ntask = "add2"\nrounds = 1\nlr = 1e-4\neval_every = 1\neval_problems = 5\n'
                    'eval_split = "test"\nprompts_per_round = 1\ngroup_size = 2\nseeds = [0]\nmodes = ["xhacpo"]\n'
                    'baseline = "xhacpo"\n[settings.other]\nagents = ["m1", "m2"]\n')
    assert hostile_table.main(["--matrix", str(path), "--out", str(tmp_path)]) == 2
    assert "no setting 'honest'" in capsys.readouterr().err


def test_the_shipped_matrix_parses_and_names_every_kind():
    matrix = hostile_table.load_matrix(ROOT / "bench" / "hostile.toml")
    kinds = {spec.split(":")[1] for s in matrix.settings for spec in s.agents if spec.startswith("hostile:")}
    assert kinds == {"copy-gold", "canary", "lie-logprob", "weak"}
    assert matrix.setting("copy-gold-keys").run.answer_keys == "coordinator"
    assert not matrix.setting("canary-nofilter").run.text_filter and matrix.setting("canary").run.text_filter
    assert {s.run.eval_split for s in matrix.settings} == {"test"} and matrix.setting("honest").run.baseline == "gspo2"
