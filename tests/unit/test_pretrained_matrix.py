"""bench/pretrained.toml: SmolLM2 with the tiny words partner on add2-words, LoRA, tuned on validation."""

from __future__ import annotations

import pytest

from hacfed.tools.experiments.matrix import MatrixError, load_matrix
from hacfed.tools.experiments.runner import plan_runs
from tests.unit.test_bench_modes import ROOT, _matrix

TUNING = ("tune-lr1e-4", "tune-lr3e-4", "tune-lr1e-3")


def test_pretrained_matrix_tunes_on_validation_and_reports_on_the_test_split():
    matrix = load_matrix(ROOT / "bench" / "pretrained.toml")
    assert matrix.names == (*TUNING, "words")
    for name in TUNING:
        run = matrix.setting(name).run
        assert run.eval_split == "validation" and run.finetune == "lora", name
    assert sorted(matrix.setting(name).run.lr for name in TUNING) == [1e-4, 3e-4, 1e-3]
    assert all(matrix.setting(name).run.modes == ("gspo2",) for name in TUNING)  # tuned on the baseline
    words = matrix.setting("words")
    assert words.agents == ("smollm2", "tiny-llama-words") and words.run.task == "add2-words"
    assert set(words.run.modes) == {"gspo2", "xhacpo", "naive", "hacpo"} and words.run.baseline == "gspo2"
    assert words.run.seeds == (0, 1, 2) and words.run.finetune == "lora"
    assert (words.run.eval_split, words.run.eval_problems) == ("test", 500)
    assert words.run.eval_every == words.run.rounds and not words.run.eval_start  # evaluated at the end only
    runs = plan_runs(matrix, ["words"])
    assert len(runs) == 12 and all(r.sim_args[-3:] == ("--finetune", "lora", "--no-text-filter") for r in runs)


def test_finetune_reaches_hacfed_sim_and_a_bad_one_is_refused_by_name():
    assert all("--finetune" not in r.sim_args for r in plan_runs(_matrix()))
    full = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "finetune": "full"}}))
    assert {r.sim_args[-2:] for r in full} == {("--finetune", "full")}
    assert all("--no-text-filter" not in r.sim_args for r in full)  # absent: the filter stays on
    off = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "text_filter": False}}))
    assert off and all(r.sim_args[-1] == "--no-text-filter" for r in off)
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: finetune must be one of auto, full, lora, got 'qlora'"):
        _matrix({"pair": {"agents": ["m1", "m2"], "finetune": "qlora"}})


def test_eval_sampled_false_drops_the_sampled_evaluation_and_a_non_bool_is_refused():
    assert all("--eval-sampled" in r.sim_args for r in plan_runs(_matrix()))  # absent: sampled pass@1 too
    greedy = plan_runs(_matrix({"pair": {"agents": ["m1", "m2"], "eval_sampled": False}}))
    assert greedy and all("--eval-sampled" not in r.sim_args for r in greedy)
    words = plan_runs(load_matrix(ROOT / "bench" / "pretrained.toml"), ["words"])
    assert all("--eval-sampled" not in r.sim_args for r in words)
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: eval_sampled must be true or false, got 'no'"):
        _matrix({"pair": {"agents": ["m1", "m2"], "eval_sampled": "no"}})


def test_rules_matrix_runs_the_issue_modes_on_enough_rounds_and_seeds():
    matrix = load_matrix(ROOT / "bench" / "pretrained_rules.toml")
    seeds: dict[str, set[int]] = {}
    for name in ("words", "words-paper"):
        run = matrix.setting(name).run
        assert run.rounds >= 8 and run.eval_split == "test" and run.eval_problems == 500 and run.finetune == "lora"
        for mode in run.modes:
            seeds.setdefault(mode, set()).update(run.seeds)
    for mode in ("xhacpo", "xhacpo-rules", "gspo", "gspo2"):  # recommended, its candidate, alone, GSPO x2
        assert len(seeds[mode]) >= 5, mode
    for mode in ("hacpo", "naive"):
        assert len(seeds[mode]) >= 3, mode
    assert matrix.setting("weak").agents == ("smollm2", "hostile:weak")
    rules = matrix.setting("tune-rules").run  # every candidate is chosen on the validation split
    assert rules.eval_split == "validation"
    assert {"xhacpo-rules", "xhacpo-guided", "xhacpo-guided-hinted", "xhacpo", "gspo"} <= set(rules.modes)
    tune = matrix.setting("tune-t07").run
    assert tune.eval_split == "validation" and (tune.temperature, tune.max_new_tokens) == (0.7, 96)
    runs = plan_runs(matrix, ["tune-t10"])
    assert runs and all(r.sim_args[-4:] == ("--temperature", "1.0", "--max-new-tokens", "96") for r in runs)


def test_temperature_and_budget_are_optional_and_checked():
    assert all("--temperature" not in r.sim_args and "--max-new-tokens" not in r.sim_args
               for r in plan_runs(_matrix()))
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: temperature must be a number > 0, got 0"):
        _matrix({"pair": {"agents": ["m1", "m2"], "temperature": 0}})
    with pytest.raises(MatrixError, match=r"\[settings.pair\]: max_new_tokens must be an int >= 1, got 0"):
        _matrix({"pair": {"agents": ["m1", "m2"], "max_new_tokens": 0}})


def test_rules_matrix_holds_the_pretrained_testbeds():
    """The state pair and the cross-architecture pair on add2-words, at the study's run sizes."""
    matrix = load_matrix(ROOT / "bench" / "pretrained_rules.toml")
    assert matrix.setting("state").agents == ("smollm2", "smollm2-drilled")
    assert matrix.setting("worked").agents == ("smollm2", "tiny-qwen2-worked")
    for name in ("state", "worked"):
        run = matrix.setting(name).run
        assert run.task == "add2-words" and run.rounds >= 8
        assert run.eval_split == "test" and run.eval_problems == 500
