"""The built-in GSM8K task, the truncation warning and the response budget a sim run takes from its task."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hacfed.tasks.math_data import GSM8K_MAX_NEW_TOKENS, GSM8K_VALIDATION
from hacfed.tasks.registry import load_task
from hacfed.tools.sim import TASKS, response_budget, round_postfix, summary_table
from hacfed.truncation_warnings import TRUNCATION_WARN_FRAC, TruncationWarnings


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    task = load_task({"kind": "gsm8k", "cache_dir": str(tmp_path_factory.mktemp("hf-cache"))})
    yield task
    task.close()


def test_gsm8k_is_built_in_with_a_held_out_validation_split(gsm8k):
    train, validation, test = gsm8k.train_problems(), gsm8k.validation_problems(), gsm8k.eval_problems()
    assert (len(train), len(validation), len(test)) == (7473 - GSM8K_VALIDATION, GSM8K_VALIDATION, 1319)
    assert not {p.prompt_id for p in validation} & {p.prompt_id for p in train}
    assert gsm8k.max_new_tokens == GSM8K_MAX_NEW_TOKENS and gsm8k.name == "gsm8k"
    first = test[0]
    assert first.answer == "18" and "boxed" in first.messages[-1].content
    # a small model seldom boxes: the last number counts when there is no \boxed{}
    assert gsm8k.verify(first, "She makes 9 * 2 = 18 dollars.").reward == 1.0
    assert gsm8k.verify(first, "The answer is \\boxed{18}. Check: 20").reward == 1.0
    assert gsm8k.verify(first, "She makes 19 dollars.").reward == 0.0


def test_gsm8k_options_are_checked(tmp_path):
    task = load_task({"kind": "gsm8k", "max_train": 10, "max_new_tokens": 64, "num_validation": 5,
                      "cache_dir": str(tmp_path)})
    assert (len(task.train_problems()), len(task.validation_problems()), task.max_new_tokens) == (10, 5, 64)
    with pytest.raises(ValueError, match="unknown key.*'budget'"):
        load_task({"kind": "gsm8k", "budget": 3})
    with pytest.raises(ValueError, match="fixed by the built-in task"):
        load_task({"kind": "gsm8k", "train_files": ["x.jsonl"]})
    with pytest.raises(ValueError, match="max_new_tokens must be None or an int >= 1"):
        load_task({"kind": "gsm8k", "max_new_tokens": 0})


def test_sim_takes_the_budget_from_the_task_unless_asked(gsm8k):
    assert TASKS["gsm8k"][1] is None
    assert response_budget(None, gsm8k) == GSM8K_MAX_NEW_TOKENS
    assert response_budget(12, gsm8k) == 12
    with pytest.raises(ValueError, match="pass --max-new-tokens"):
        response_budget(None, load_task(TASKS["add2"][0]))


def test_truncation_warns_once_per_lab_above_the_threshold_and_again_when_worse():
    warnings = TruncationWarnings("--max-new-tokens")
    assert warnings.check("a", TRUNCATION_WARN_FRAC) is None and warnings.check("a", None) is None
    text = warnings.check("a", 0.5)
    assert text is not None and "a: 50%" in text and "--max-new-tokens" in text and "up from" not in text
    assert warnings.check("a", 0.55) is None and warnings.check("a", 0.3) is None  # not worse by 10 points
    worse = warnings.check("a", 0.6)
    assert worse is not None and "a: 60%" in worse and "(up from 50%)" in worse
    assert warnings.check("a", 0.65) is None  # measured from the last warning
    assert warnings.check("b", 0.11) is not None


def test_truncated_fraction_shows_in_the_bar_and_the_summary():
    m = SimpleNamespace(participant_id="smol", reward_mean=0.25, train_metrics={"rollout_truncated_frac": 0.125})
    quiet = SimpleNamespace(participant_id="tiny", reward_mean=0.0, train_metrics={"rollout_truncated_frac": 0.0})
    assert round_postfix([m, quiet]) == {"smol": "0.25 cut 12%", "tiny": "0.00"}
    rows = [{"round": 1, "agent": "smol", "reward_mean": 0.25, "rollout_truncated_frac": 0.125}]
    assert summary_table(rows).splitlines()[1].split()[-1] == "12%"


def test_a_bad_temperature_is_refused_in_one_line(capsys):
    from hacfed.tools.cli import main

    assert main(["sim", "--temperature", "0", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "temperature must be a number > 0, got 0.0" in err and err.count("\n") == 1
