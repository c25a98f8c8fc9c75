"""Sampling that matches the policy: at temperature T, the rollout's log-probs, the learner's
recomputed ones and the update's ratios are all of softmax(logits / T), worked by hand."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from hacfed.algorithm import HacpoConfig
from hacfed.clients.update import hacpo_update
from hacfed.models.zoo import build_untrained
from hacfed.rollout import generate, sequence_logprobs
from hacfed.rollout.logprobs import gather_token_logprobs
from hacfed.trajectory import ChatMessage, Trajectory, render_prompt_ids
from tests.unit.test_logprobs import PROMPTS, eos_bias
from tests.unit.test_update_example import TOK, UniformLM


def test_gather_tempered_by_hand():
    # logits [0, 2 ln 3] at T = 2 -> [0, ln 3] -> probs [1/4, 3/4]; at T = 1 -> [1/10, 9/10]
    logits = torch.tensor([[0.0, 2 * math.log(3.0)], [0.0, 2 * math.log(3.0)]])
    out = gather_token_logprobs(logits, torch.tensor([1, 0]), temperature=2.0)
    torch.testing.assert_close(out, torch.tensor([math.log(0.75), math.log(0.25)]), atol=1e-6, rtol=0)
    out = gather_token_logprobs(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(out, torch.tensor([math.log(0.9), math.log(0.1)]), atol=1e-6, rtol=0)


def test_generate_at_a_temperature_reports_the_tempered_policy_the_trainer_scores():
    model, tok = build_untrained("tiny-llama", seed=0)
    with eos_bias(model, tok.eos_token_id, 0.5):
        groups = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=8, temperature=0.5, seed=3)
        flat = [c for group in groups for c in group]
        prompt_ids = [render_prompt_ids(tok, p) for p in PROMPTS for _ in range(2)]
        with torch.inference_mode():
            tempered, _ = sequence_logprobs(model, prompt_ids, [c.token_ids for c in flat], tok.pad_token_id,
                                            temperature=0.5)
            plain, _ = sequence_logprobs(model, prompt_ids, [c.token_ids for c in flat], tok.pad_token_id)
    assert sum(len(c.token_ids) for c in flat) > 2 * len(flat)
    for row, c in enumerate(flat):
        n = len(c.token_ids)
        torch.testing.assert_close(tempered[row, :n], torch.tensor(c.logprobs), atol=2e-5, rtol=0)
    # not vacuous: the untempered policy gives other numbers for the same tokens
    assert max(abs(plain[r, :len(c.token_ids)].sum().item() - c.logprob_sum) for r, c in enumerate(flat)) > 0.1


def test_update_scores_the_learner_at_the_pool_temperature():
    # The learner gives 'c' (id 4) the logit 2 ln 3 and every other character 0. At T = .5 'c' has
    # e^{4 ln 3} = 81 against 1 for each of the 31 others: log p(c) = ln(81/112), log p(d) = ln(1/112).
    # A peer that samples from the same policy at T = .5 claims their sum for "cd" (2 tokens), so the
    # ratio of the update at T = .5 is exactly 1; scored untempered (9/40, 1/40) it is not.
    claim = math.log(81 / 112) + math.log(1 / 112)
    pool = [
        Trajectory("me-0", "p", "me", 0, (ChatMessage("user", "p"),), "a", 1.0, -1.0, 1, "stop"),
        Trajectory("me-1", "p", "me", 0, (ChatMessage("user", "p"),), "b", 0.0, -1.0, 1, "stop"),
        Trajectory("zed-0", "p", "zed", 0, (ChatMessage("user", "p"),), "cd", 1.0, claim, 2, "stop"),
    ]
    ratios = {}
    for t in (0.5, 1.0):
        model = UniformLM()
        model.logit.data[4] = 2 * math.log(3.0)
        out = hacpo_update(model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), None, pool, "me", ("me", "zed"),
                           {"me": 0.5, "zed": 0.5}, HacpoConfig(), minibatch_size=3, max_grad_norm=1e9,
                           max_prompt_len=64, max_response_len=64, temperature=t)
        ratios[t] = out["cross/zed/ratio_p50"]
    assert ratios[0.5] == pytest.approx(1.0, abs=1e-6)
    # untempered: s = sqrt((9/40 · 1/40) / (81/112 · 1/112)) = sqrt(112896 / 129600) = 14/15
    assert ratios[1.0] == pytest.approx(math.exp((math.log(9 / 40) + math.log(1 / 40) - claim) / 2), abs=1e-6)
    assert ratios[1.0] == pytest.approx(14 / 15, abs=1e-6)


def test_kl_to_the_reference_is_of_the_tempered_policies():
    # The learner is uniform (1/32 per token at any T); the reference gives 'a' (id 2) the logit
    # 2 ln 3. At T = .5 the reference has 'a' 81/112 and every other token 1/112, at T = 1 9/40 and
    # 1/40. k3(d) = e^d − d − 1 with d = ref − learner, per token over "a"+EOS and "b"+EOS:
    #   T = .5: 'a' d = ln(81·32/112): 19.001192; others d = ln(32/112): .538477
    #           sequences (19.001192 + .538477) / 2 = 9.769834 and .538477 -> KL 5.154156
    #   T = 1:  'a' d = ln 7.2: 4.225919; others d = ln .8: .023144 -> (2.124531 + .023144) / 2 = 1.073838
    ref_model = UniformLM()
    ref_model.logit.data[2] = 2 * math.log(3.0)

    @contextlib.contextmanager
    def reference():
        yield ref_model

    pool = [
        Trajectory("me-0", "p", "me", 0, (ChatMessage("user", "p"),), "a", 1.0, -1.0, 1, "stop"),
        Trajectory("me-1", "p", "me", 0, (ChatMessage("user", "p"),), "b", 0.0, -1.0, 1, "stop"),
    ]
    kl = {}
    for t in (0.5, 1.0):
        model = UniformLM()
        out = hacpo_update(model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), reference, pool, "me", ("me",),
                           {"me": 0.5}, HacpoConfig(), minibatch_size=2, max_grad_norm=1e9, max_prompt_len=64,
                           max_response_len=64, temperature=t)
        kl[t] = out["kl"]
    assert kl[0.5] == pytest.approx(5.154156, abs=1e-5)
    assert kl[1.0] == pytest.approx(1.073838, abs=1e-5)
