"""bench/pretrained_testbeds.py: an answer cut at a budget reads as that budget's answer, the scorer's
likelihood of a partner's text is per UTF-8 byte (as xhacpo reads it), and bad input exits 2 with one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hacfed.models.zoo import build_untrained
from hacfed.rollout.hf import Completion
from hacfed.tasks.registry import load_task
from hacfed.trajectory import render_prompt_ids

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pretrained_testbeds.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("pretrained_testbeds_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Digits:
    """A tokenizer whose token i is the digit i."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(str(i) for i in ids)


def _answer(ids: tuple[int, ...]) -> Completion:
    return Completion("".join(map(str, ids)), ids, (0.0,) * len(ids), "stop")


def test_an_answer_cut_at_a_budget_is_its_first_tokens_and_counts_as_cut(bench):
    answers = [_answer((1, 2, 3, 4, 5)), _answer((7, 8))]
    assert bench.at_budget(_Digits(), answers, 4) == (["1234", "78"], [True, False])
    # EOS is not in token_ids: five tokens leave no room for it in a budget of five
    assert bench.at_budget(_Digits(), answers, 5) == (["12345", "78"], [True, False])
    assert bench.at_budget(_Digits(), answers, 6) == (["12345", "78"], [False, False])
    assert bench.at_budget(_Digits(), answers, 2) == (["12", "78"], [True, True])


def test_the_scorer_s_likelihood_is_its_own_log_prob_per_utf8_byte(bench):
    """By hand: one forward pass over prompt + answer, the answer tokens' log-softmax summed, divided
    by the answer's bytes (a BPE tokenizer, so tokens and bytes differ)."""
    model, tokenizer = build_untrained("tiny-qwen2", seed=0)
    scorer = SimpleNamespace(model=model.eval(), tokenizer=tokenizer)
    problems = load_task({"kind": "arithmetic", "style": "words", "num_train": 10, "num_eval": 4}).eval_problems()[:3]
    texts = ["37 + 58 = 95", "95", "The sum is 95, so 95."]
    got = bench.per_byte_logps(scorer, problems, texts)
    tokens = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    assert tokens[0] != len(texts[0].encode()) and tokens[2] != len(texts[2].encode())
    for problem, text, value in zip(problems, texts, got):
        prompt = render_prompt_ids(tokenizer, problem.messages)
        answer = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + answer])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        expected = float(logp[torch.arange(len(answer)), torch.tensor(answer)].sum()) / len(text.encode())
        assert value == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(("argv", "message"), [
    (["story", "--budgets", "64,0"], "--budgets: must be ints >= 1 separated by commas, got '64,0'"),
    (["story", "--temperature", "0"], "--temperature: must be a finite number > 0, got '0'"),
    (["story", "--problems", "x"], "--problems: must be an int >= 1, got 'x'"),
    (["accuracy", "--task", "add3"], "--task: invalid choice: 'add3'"),
    (["accuracy", "--budget", "-1"], "--budget: must be an int >= 1, got '-1'"),
])
def test_bad_flags_exit_2_naming_the_value(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unknown_model_is_an_error_not_a_traceback(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["accuracy", "--models", "no-such-model", "--problems", "1"])
    assert exit_info.value.code == 2
    assert "pretrained_testbeds.py: error: unknown model 'no-such-model'" in capsys.readouterr().err
