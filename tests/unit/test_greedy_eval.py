"""Batched greedy evaluation: the same answers as `generate(greedy=True)`, text for text."""

from __future__ import annotations

import pytest

from hacfed.models.zoo import build_untrained
from hacfed.rollout.greedy_eval import greedy_generate, shared_prefix_length
from hacfed.rollout.hf import generate
from hacfed.trajectory import ChatMessage
from tests.unit.test_logprobs import eos_bias

# Prompts of several lengths with a common start (the system message), so that batches pad, share a
# prefix and stop at different steps.
PROMPTS = [
    [ChatMessage("system", "Answer with a number."), ChatMessage("user", text)]
    for text in ("7+8=", "What is 12+30? Think, then answer.", "x", "12 + 9 = ?", "Add 3 and 4.",
                 "What is forty-one plus seven? Reply with only the number.", "1+1", "99+99=", "zz")
]


# An EOS bias per architecture under which the untrained model stops some rows at different steps
# and runs others to the budget.
EOS_BIAS = {"tiny-llama": 0.54, "tiny-gpt2": 0.7, "tiny-qwen2": 0.45}


@pytest.fixture(scope="module", params=sorted(EOS_BIAS))
def zoo_model(request):
    model, tok = build_untrained(request.param, seed=0)
    return model, tok, EOS_BIAS[request.param]


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_greedy_generate_matches_generate_text_for_text(zoo_model, batch_size):
    model, tok, bias = zoo_model
    with eos_bias(model, tok.eos_token_id, bias):
        want = [g[0] for g in generate(model, tok, PROMPTS, max_new_tokens=12, greedy=True, batch_size=128)]
        got = greedy_generate(model, tok, PROMPTS, max_new_tokens=12, batch_size=batch_size)
    assert {c.finish_reason for c in want} == {"stop", "length"}  # both ends are exercised
    assert len({len(c.token_ids) for c in want}) >= 2
    assert [c.text for c in got] == [c.text for c in want]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    for g, w in zip(got, want):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_greedy_generate_keeps_train_mode_and_refuses_bad_sizes(zoo_model):
    model, tok, _ = zoo_model
    model.train()
    try:
        greedy_generate(model, tok, PROMPTS[:2], max_new_tokens=2)
        assert model.training
    finally:
        model.eval()
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        greedy_generate(model, tok, PROMPTS, batch_size=0)


def test_shared_prefix_length_leaves_every_row_its_last_token():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical rows: all but the last
    assert shared_prefix_length([[1, 2, 3], [1]]) == 0
    assert shared_prefix_length([[7, 8], [9, 8]]) == 0
