"""`hacpo_update` end to end on a two-peer example worked by hand (hacpo.md §2-§5).

The learner is a real torch module whose log-probs are known exactly: a context-free LM with
uniform logits over V = 32 tokens, so every token's log-prob is -log 32 = -3.465736 and each
sequence's token mean is -3.465736 too. It records, for each differentiated forward (one per
minibatch), the rows it scored and the gradient of the loss with respect to its logits. With SGD at
lr 0 the policy never moves, so every number below follows from the pool alone:

    d loss / d logits[i, t, v] = g_it · (1[v = y_it] − 1/V)      (log_softmax's derivative)

where g_it = d loss / d log π(y_it) = (d loss / d mean_i) / ratio_count_i, the gradient of the
sequence mean of row i spread over its ratio tokens. `row_grads` reads d loss / d mean_i back.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hacfed.algorithm import HacpoConfig
from hacfed.clients.update import hacpo_update, order_pool
from hacfed.trajectory import ChatMessage, Trajectory

V = 32
LOG_V = math.log(V)  # 3.465736: every learner log-prob is -LOG_V
AGENTS = ("me", "zed", "amy")  # agent order; sorted by id the peers would be amy, zed
CAPS = {"me": 0.8, "zed": 0.2, "amy": 0.4}  # P̂
# ω = ratio(source, me) = clip(P̂_source / P̂_me, 0.1, 10): zed .2 / .8 = .25, amy .4 / .8 = .5
# (inverted it would be 4 and 2). The baseline weights w = 1 / ω: zed 4, amy 2, own 1.
OMEGA = {"zed": 0.25, "amy": 0.5}


class CharTokenizer:
    """One id per character (pad 0, EOS 1); the chat template is the user's text followed by ':'."""

    pad_token_id = 0
    eos_token_id = 1
    alphabet = "abcdefghijklmnopqrstuvwxyz:?"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        assert not tokenize and add_generation_prompt
        return "".join(m["content"] for m in messages) + ":"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + self.alphabet.index(c) for c in text]}

    def decode(self, ids):
        return "".join(self.alphabet[i - 2] for i in ids if i >= 2)


class UniformLM(torch.nn.Module):
    """log π(y | anything) = −log V; records each differentiated forward's rows and logit gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.logit = torch.nn.Parameter(torch.zeros(V))
        self.calls: list[dict] = []

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep):
        logits = self.logit.reshape(1, 1, V).repeat(input_ids.shape[0], logits_to_keep, 1)  # (B, K, V)
        if torch.is_grad_enabled():
            call = {"responses": input_ids[:, -(logits_to_keep - 1):].clone()}
            logits.register_hook(lambda g: call.__setitem__("grad", g[:, :-1, :].clone()))
            self.calls.append(call)
        return SimpleNamespace(logits=logits)


TOK = CharTokenizer()


def sample(name: str, prompt: str, source: str, text: str, reward: float, log_ratio: float = 0.0,
           src_tokens: int = 4) -> Trajectory:
    """A response whose source summary makes s = exp(−LOG_V − src_mean) = exp(log_ratio):
    src_mean = −LOG_V − log_ratio, source_logp_sum = src_tokens · src_mean (the source's own token
    count, deliberately unlike the learner's character count)."""
    src_mean = -LOG_V - log_ratio
    return Trajectory(name, prompt, source, 0, (ChatMessage("user", prompt),), text, reward,
                      src_tokens * src_mean, src_tokens, "stop")


# Own samples carry a wildly wrong summary (-50 over 4 tokens): the learner re-scores its own
# samples, so their ratio is exactly 1 whatever the summary says.
POOL = [  # deliberately out of order: the update sorts it
    sample("amy-p-0", "p", "amy", "kl", 1.0, -0.15),
    sample("amy-p-1", "p", "amy", "mn", 0.0, 0.0),
    sample("amy-q-0", "q", "amy", "op", 1.0, -0.12),
    sample("amy-q-1", "q", "amy", "rs", 1.0, -0.14),
    sample("zed-p-0", "p", "zed", "cd", 0.0, -0.10, src_tokens=3),
    sample("zed-p-1", "p", "zed", "ef", 0.0, -0.20),
    sample("zed-q-0", "q", "zed", "gh", 1.0, -0.05),
    sample("zed-q-1", "q", "zed", "ij", 0.0, 0.10),
    sample("me-p-0", "p", "me", "a", 1.0, 50 / 4 - LOG_V),
    sample("me-p-1", "p", "me", "b", 0.0, 50 / 4 - LOG_V),
]  # "me" has no sample of prompt q: its submission for q was lost

# Advantages (Mechanism 1) for learner me:
#   group p, rewards me [1, 0], zed [0, 0], amy [1, 0]:
#     μ = (1·1 + 1·0 + 4·0 + 4·0 + 2·1 + 2·0) / 6 = 3 / 6 = .5   (the plain mean would be 1/3)
#     unbiased std of [1,0,0,0,1,0]: mean 1/3, Σdev² = 2·4/9 + 4·1/9 = 4/3, /5 -> sqrt(4/15) = .516398
#     A(1) = .5 / .516399 = .968245, A(0) = −.968245
#   group q, rewards zed [1, 0], amy [1, 1] (no own sample):
#     μ = (4·1 + 4·0 + 2·1 + 2·1) / 4 = 2 > reward_max 1: the binary guard fires, and with no own
#     reward to fall back on the unweighted mean is used: μ = 3/4 = .75
#     std of [1,0,1,1] = .5; A(1) = .25 / .500001 = .499999, A(0) = −.75 / .500001 = −1.499997
STD_P, STD_Q = math.sqrt(4 / 15) + 1e-6, 0.5 + 1e-6
A_P = 0.5 / STD_P
A_Q1, A_Q0 = 0.25 / STD_Q, -0.75 / STD_Q


def run(cfg: HacpoConfig = HacpoConfig(), pool=POOL) -> tuple[UniformLM, dict[str, float]]:
    model = UniformLM()
    out = hacpo_update(model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), None, pool, "me", AGENTS, CAPS,
                       cfg, minibatch_size=3, max_grad_norm=1e9, max_prompt_len=128, max_response_len=64)
    return model, out


def row_grads(call: dict) -> dict[str, float]:
    """{response text: d loss / d (row's mean log-prob over its ratio tokens)} of one minibatch."""
    out = {}
    for ids, grad in zip(call["responses"].tolist(), call["grad"]):
        text = TOK.decode(ids)  # EOS (id 1) and padding dropped: the ratio tokens
        # g_it = grad[t, y_t] / (1 − 1/V); the mean's gradient is the sum of g_it over its tokens
        out[text] = sum(float(grad[t, y]) for t, y in enumerate(ids[: len(text)])) / (1 - 1 / V)
    return out


def test_update_order_ratios_omega_stepwise_bound_and_guard_by_hand():
    model, out = run()
    # Order: own samples first (me-p-0, me-p-1), then zed's, then amy's (agent order, not ids), each
    # source in pool order; minibatches of 3, so minibatch 0 holds a cross row (zed-p-0).
    assert [[TOK.decode(r) for r in c["responses"].tolist()] for c in model.calls] == [
        ["a", "b", "cd"], ["ef", "gh", "ij"], ["kl", "mn", "op"], ["rs"]]
    # d loss / d mean_i = −(d obj_i / d mean_i) / B, B = 3 (1 in the last minibatch):
    #   own, s = 1 inside [1 − 3e-4, 1 + 4e-4]: obj = s·A, d obj = s·A = A
    #   cross, c = clip(s, L_m, 1): inside -> d obj = c·sg(c)·ω·A -> c²·ω·A; outside -> 0
    # s = exp(−3.465736 − src_mean), src_mean = source_logp_sum / source_token_count.
    expected = [
        {  # m = 0, L_0 = .8
            "a": -A_P / 3,  # −.968245 / 3 = −.322748
            "b": A_P / 3,
            # zed-p-0: src_mean = −10.097208 / 3 = −3.365736 -> s = e^−.1 = .904837 in [.8, 1]
            #   c²·ω·A = .818731 · .25 · −.968245 = −.198183 -> +.066061
            "cd": math.exp(-0.2) * 0.25 * A_P / 3,
        },
        {  # m = 1, L_1 = .825
            "ef": 0.0,  # s = e^−.2 = .818731 < .825: clipped (it would carry at m = 0)
            "gh": -math.exp(-0.1) * 0.25 * A_Q1 / 3,  # s = e^−.05: .904837 · .25 · .499999 / 3 = −.037702
            "ij": 0.0,  # s = e^.1 = 1.105171 > 1: clipped
        },
        {  # m = 2, L_2 = .85
            "kl": -math.exp(-0.3) * 0.5 * A_P / 3,  # s = e^−.15 = .860708 >= .85: .740818 · .5 · .968245 / 3 = −.119549
            "mn": A_P * 0.5 / 3,  # s = 1: 1 · .5 · −.968245 / 3 -> +.161374
            "op": -math.exp(-0.24) * 0.5 * A_Q1 / 3,  # s = e^−.12: .786628 · .5 · .499999 / 3 = −.065552
        },
        {"rs": 0.0},  # m = 3, L_3 = .875: s = e^−.14 = .869358 < .875 (it would carry at m = 2)
    ]
    assert expected[0]["cd"] == pytest.approx(0.066061, abs=1e-6)
    assert expected[1]["gh"] == pytest.approx(-0.037702, abs=1e-6)
    for call, want in zip(model.calls, expected):
        got = row_grads(call)
        assert set(got) == set(want)
        for text in want:
            assert got[text] == pytest.approx(want[text], abs=1e-6), (text, got[text], want[text])

    # Per-source ratio quantiles, from the same s as above (p10, p50, p90 = sorted[0], [2], [3]):
    assert out["cross/zed/ratio_p10"] == pytest.approx(math.exp(-0.2), abs=1e-6)
    assert out["cross/zed/ratio_p50"] == pytest.approx(math.exp(-0.05), abs=1e-6)
    assert out["cross/zed/ratio_p90"] == pytest.approx(math.exp(0.1), abs=1e-6)
    assert out["cross/amy/ratio_p10"] == pytest.approx(math.exp(-0.15), abs=1e-6)
    assert out["cross/amy/ratio_p50"] == pytest.approx(math.exp(-0.12), abs=1e-6)
    assert out["cross/amy/ratio_p90"] == pytest.approx(1.0, abs=1e-6)
    # carrying gradient: zed cd, gh of 4; amy kl, mn, op of 4
    assert out["cross/zed/grad_frac"] == 0.5 and out["cross/amy/grad_frac"] == 0.75
    # L_m averaged over the 4 minibatches (each holds a cross row): (.8 + .825 + .85 + .875) / 4
    assert out["cross_lower_bound"] == pytest.approx(0.8375, abs=1e-9)
    assert out["num_samples"] == 10 and out["num_updates"] == 4 and out["skipped_views"] == 0


def test_order_is_own_samples_then_each_source_in_agent_order():
    ids = [t.trajectory_id for t in order_pool(POOL, "me", AGENTS, HacpoConfig())]
    assert ids == ["me-p-0", "me-p-1", "zed-p-0", "zed-p-1", "zed-q-0", "zed-q-1",
                   "amy-p-0", "amy-p-1", "amy-q-0", "amy-q-1"]
    ids = [t.trajectory_id for t in order_pool(POOL, "zed", ("amy", "zed", "me"), HacpoConfig())]
    assert ids == ["zed-p-0", "zed-p-1", "zed-q-0", "zed-q-1", "amy-p-0", "amy-p-1", "amy-q-0", "amy-q-1",
                   "me-p-0", "me-p-1"]


def test_minibatch_losses_by_hand():
    # loss_m = −mean_i obj_i, obj = A for own rows (s = 1), c·c·ω·A for cross rows:
    #   m0: −(.968245 − .968245 + .818731·.25·−.968245) / 3 = .198183 / 3 = .066061
    #   m1: c = .825, .951229, 1: −(.680625·.25·−.968245 + .904837·.25·.499999 + .25·−1.499997) / 3
    #       = −(−.164752 + .113105 − .374999) / 3 = .142215
    #   m2: −(.740818·.5·.968245 + .5·−.968245 + .786628·.5·.499999) / 3 = −(.358647 − .484123 + .196657) / 3 = −.023727
    #   m3: c = .875: −(.875² · .5 · .499999) = −.191406
    losses = [
        -(A_P - A_P - math.exp(-0.2) * 0.25 * A_P) / 3,
        -(-(0.825**2) * 0.25 * A_P + math.exp(-0.1) * 0.25 * A_Q1 + 0.25 * A_Q0) / 3,
        -(math.exp(-0.3) * 0.5 * A_P - 0.5 * A_P + math.exp(-0.24) * 0.5 * A_Q1) / 3,
        -(0.875**2) * 0.5 * A_Q1,
    ]
    assert losses == pytest.approx([0.066061, 0.142215, -0.023727, -0.191406], abs=1e-6)
    _, out = run()
    assert out["loss"] == pytest.approx(sum(losses) / 4, abs=1e-6)
    # advantages over all 10 samples: p: 2·A_P + 2·(−A_P)... = A_P·(2 − 4) ; q: 3·A_Q1 + A_Q0
    assert out["adv_mean"] == pytest.approx((A_P * (2 - 4) + 3 * A_Q1 + A_Q0) / 10, abs=1e-6)
    assert out["own_adv_abs_mean"] == pytest.approx(A_P, abs=1e-6)


def test_sapo_scores_peer_text_against_the_learners_own_old_policy():
    # sapo treats peers' text as the learner's own samples: every ratio is exactly 1 (the learner
    # scores itself), and every row takes the own-sample objective with the pooled baseline:
    #   p: mean 1/3, A(1) = (2/3) / .516399 = 1.290994, A(0) = −(1/3) / .516399 = −.645497
    model, out = run(HacpoConfig(mode="sapo"))
    got = row_grads(model.calls[0])
    a1, a0 = (2 / 3) / STD_P, -(1 / 3) / STD_P
    assert got == pytest.approx({"a": -a1 / 3, "b": -a0 / 3, "cd": -a0 / 3}, abs=1e-6)
    assert out["cross/zed/ratio_p10"] == pytest.approx(1.0, abs=1e-6)
