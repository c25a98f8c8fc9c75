"""xhacpo end to end, and the learner-side rules for a partner's sample, worked by hand
(docs/xhacpo.md, docs/partner_rules.md).

Uses the hand-worked harness of test_update_example: a context-free learner with uniform logits
over V = 32 characters (every log-prob −log 32, one token per byte), SGD at lr 0, and the gradient
of the loss with respect to each row's mean log-prob read back per minibatch.
"""

from __future__ import annotations

import math

import pytest
import torch

from hacfed.algorithm import HacpoConfig
from hacfed.clients.partner_rules import counts_from_metrics, select_partner_views
from hacfed.clients.update import hacpo_update
from hacfed.trajectory import ChatMessage, TrainingView, Trajectory
from tests.unit.test_update_example import LOG_V, TOK, UniformLM, row_grads

XHACPO = dict(mode="xhacpo", cross_ratio_unit="byte", cross_clip_style="pessimistic", cross_negatives="skip")
CAPS = {"me": 0.8, "zed": 0.2}  # ω(zed -> me) = .25; the baseline weight of zed's samples 1/ω = 4


def traj(name: str, prompt: str, source: str, text: str, reward: float, logp_sum: float, tokens: int = 4):
    return Trajectory(name, prompt, source, 0, (ChatMessage("user", prompt),), text, reward, logp_sum, tokens, "stop")


def run(cfg: HacpoConfig, pool, trust=None, minibatch_size: int = 3):
    """The update on `pool`; every sample the rules keep runs its forward, zero-advantage ones too
    (`skip_no_grad=False`), so the rows of `grads` say which samples stayed in the batch."""
    model = UniformLM()
    out = hacpo_update(model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), None, pool, "me", ("me", "zed"),
                       CAPS, cfg, minibatch_size=minibatch_size, max_grad_norm=1e9, max_prompt_len=128,
                       max_response_len=64, trust=trust, skip_no_grad=False)
    return model, out


def grads(model) -> dict[str, float]:
    out: dict[str, float] = {}
    for call in model.calls:
        out.update(row_grads(call))
    return out


# One prompt p: own "a" (1) and "b" (0), zed's success "cd" whose source claims Σ log p = S over its
# own 4 tokens, S = −2·LOG_V + 0.2. The learner's Σ log π("cd") = −2·LOG_V over 2 bytes (2 tokens).
#   per byte  (xhacpo): s = exp((−2·LOG_V − S) / 2) = e^−.1 = .904837, inside [L_0 = .8, 1]
#   per token (paper):  s = exp(−LOG_V − S / 4) = exp(−LOG_V / 2 − .05) = .168155, below the window
# Advantages, group p = [1, 0, 1] with weights [1, 1, 4]: μ = 5/3 > 1, so the binary guard takes
# the own mean .5; unbiased std = sqrt(1/3) = .577350: A(1) = .5 / .577351 = .866024, A(0) = −A(1).
S = -2 * LOG_V + 0.2
POOL_P = [
    traj("me-p-0", "p", "me", "a", 1.0, -3.0, 1),
    traj("me-p-1", "p", "me", "b", 0.0, -3.0, 1),
    traj("zed-p-0", "p", "zed", "cd", 1.0, S, 4),
]
A1 = 0.5 / (math.sqrt(1 / 3) + 1e-6)


def test_xhacpo_update_uses_the_per_byte_ratio():
    """Fails if `sequence_ratio.per_byte` returns False (the per-token ratio .168 would then take
    the one-sided clip's weight s · L_0 · ω · A instead of c² · ω · A)."""
    model, out = run(HacpoConfig(**XHACPO), POOL_P)
    # one minibatch of 3; d loss / d mean = −d obj / 3; own: d obj = A; cross inside: c·c·ω·A
    want = {"a": -A1 / 3, "b": A1 / 3, "cd": -math.exp(-0.2) * 0.25 * A1 / 3}
    assert want["cd"] == pytest.approx(-0.059087, abs=1e-6)  # .818731 · .25 · .866024 / 3
    assert grads(model) == pytest.approx(want, abs=1e-6)
    assert out["cross/zed/ratio_p50"] == pytest.approx(math.exp(-0.1), abs=1e-6)
    # the paper's per-token unit on the same pool: s = .168155 below the window, weight s · .8 · ω · A
    model, out = run(HacpoConfig(**{**XHACPO, "cross_ratio_unit": "token"}), POOL_P)
    s_tok = math.exp(-LOG_V / 2 - 0.05)
    assert s_tok == pytest.approx(0.168155, abs=1e-6)
    assert grads(model)["cd"] == pytest.approx(-s_tok * 0.8 * 0.25 * A1 / 3, abs=1e-6)


# Two prompts. p: own [1, 0] (mean .5), zed "cd" 1 and "ef" 0. q: own [0, 0] (mean 0: all failed),
# zed "gh" 1 and "ij" 0. Source claims are the learner's own values per byte (s = 1) unless said.
def rescue_pool(claim_q: float = -2 * LOG_V):
    return [
        traj("me-p-0", "p", "me", "a", 1.0, -3.0, 1),
        traj("me-p-1", "p", "me", "b", 0.0, -3.0, 1),
        traj("me-q-0", "q", "me", "k", 0.0, -3.0, 1),
        traj("me-q-1", "q", "me", "l", 0.0, -3.0, 1),
        traj("zed-p-0", "p", "zed", "cd", 1.0, -2 * LOG_V, 2),
        traj("zed-p-1", "p", "zed", "ef", 0.0, -2 * LOG_V, 2),
        traj("zed-q-0", "q", "zed", "gh", 1.0, claim_q, 2),
        traj("zed-q-1", "q", "zed", "ij", 0.0, claim_q, 2),
    ]


def test_rescue_counts_a_partner_only_where_every_own_sample_failed():
    model, out = run(HacpoConfig(**XHACPO, rescue_max_own_reward=0.0), rescue_pool(), minibatch_size=8)
    # p's partner samples leave the batch; q keeps them: rows a, b, k, l, gh, ij
    assert sorted(grads(model)) == ["a", "b", "gh", "ij", "k", "l"]
    # p alone (own [1, 0]): plain group, μ = .5, std = sqrt(.5) -> A = ±.5 / .707108
    # q = [0, 0, 1, 0] with weights [1, 1, 4, 4]: μ = 4/4 = 1, not > 1; std of [0,0,1,0] = .5
    #   A(k) = A(l) = A(ij) = −1 / .500001, A(gh) = 0: the partner's success carries no gradient
    a_p = 0.5 / (math.sqrt(0.5) + 1e-6)
    g = grads(model)
    assert g["a"] == pytest.approx(-a_p / 6, abs=1e-6) and g["b"] == pytest.approx(a_p / 6, abs=1e-6)
    assert g["k"] == pytest.approx(1 / 0.500001 / 6, abs=1e-6)
    assert g["gh"] == 0.0 and g["ij"] == 0.0  # a failure of a peer is skipped (xhacpo)
    assert out["partner/zed/not_short_frac"] == 0.5 and out["partner/zed/kept_frac"] == 0.5
    assert out["partner/kept_frac"] == 0.5
    # short prompts of zed: q only (p's own mean .5 > 0); useful: none (gh's 1 is kept, but A = 0
    # does not matter: "useful" is a kept sample above the learner's own mean 0) -> q
    assert counts_from_metrics(out) == {"zed": (1, 1)}
    # off (1.0, the default): every partner sample stays
    model, out = run(HacpoConfig(**XHACPO), rescue_pool(), minibatch_size=8)
    assert sorted(grads(model)) == ["a", "b", "cd", "ef", "gh", "ij", "k", "l"]
    assert "partner/kept_frac" not in out  # no rule on: the metrics are the mode's own


def test_likelihood_rule_reads_the_learners_per_byte_probability_not_the_claim():
    # The learner's per-byte probability of every text is 1/32 = .03125 (uniform). A floor just
    # above leaves every partner sample out, one just below keeps them all, whatever the source
    # claims (zed's q claims are made absurdly likely or unlikely).
    for claim in (-0.001, -80.0):
        model, out = run(HacpoConfig(**XHACPO, partner_min_byte_prob=0.0313), rescue_pool(claim), minibatch_size=8)
        assert sorted(grads(model)) == ["a", "b", "k", "l"]
        assert out["partner/zed/improbable_frac"] == 1.0 and out["partner/grad_frac"] == 0.0
        model, out = run(HacpoConfig(**XHACPO, partner_min_byte_prob=0.0312), rescue_pool(claim), minibatch_size=8)
        assert sorted(grads(model)) == ["a", "b", "cd", "ef", "gh", "ij", "k", "l"]
        assert out["partner/zed/improbable_frac"] == 0.0


def test_trust_scales_the_partners_omega():
    cfg = HacpoConfig(**XHACPO, trust_rate=0.5)
    full, _ = run(cfg, POOL_P)
    half, out = run(cfg, POOL_P, trust={"zed": 0.5})
    assert grads(half)["cd"] == pytest.approx(grads(full)["cd"] * 0.5, abs=1e-9)
    assert grads(half)["a"] == grads(full)["a"]
    # trust off (rate 0): a weight handed in changes nothing
    off, _ = run(HacpoConfig(**XHACPO), POOL_P, trust={"zed": 0.5})
    assert grads(off) == grads(full)


def view(prompt: str, source: str, reward: float) -> TrainingView:
    return TrainingView("t", prompt, source, "me", (5,), (6, 1), 1, reward, -1.0, False, -1.0, text_bytes=1)


def test_selection_by_hand():
    views = [view("p", "me", 0.0), view("p", "me", 0.5), view("p", "zed", 1.0), view("p", "zed", 0.0),
             view("q", "me", 1.0), view("q", "zed", 1.0), view("r", "zed", 1.0)]
    cfg = HacpoConfig(**XHACPO, rescue_max_own_reward=0.25, partner_min_byte_prob=0.5)
    # p: own mean .25 <= .25 -> short; q: own mean 1 -> not short; r: no own sample -> mean 0, short
    # likelihood: view 3 (zed's p failure) at log .4 < log .5 -> improbable
    kept, sel = select_partner_views(views, "me", cfg, {2: math.log(0.6), 3: math.log(0.4), 5: 0.0, 6: 0.0})
    assert sel.keep == [True, True, True, False, True, False, True]
    c = sel.counts["zed"]
    assert (c.offered, c.not_short, c.improbable, c.kept) == (4, 1, 1, 2)
    assert (c.short_prompts, c.useful_prompts) == (2, 2)  # p (1 > .25) and r (1 > 0)
    assert len(kept) == 5
