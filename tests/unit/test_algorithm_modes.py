"""The modes beyond paper HACPO, pinned against numbers worked by hand: xhacpo (hacfed's extension,
docs/xhacpo.md), naive's bounded cross ratio, sapo, grpo, and the diagnostics that describe them."""

from __future__ import annotations

import math

import pytest
import torch

from hacfed.algorithm import HacpoConfig, grpo_token_loss, hacpo_advantages, hacpo_policy_loss
from hacfed.clients.sequence_ratio import learner_norms, needs_own_old, old_side
from hacfed.clients.update_metrics import summarize_cross
from hacfed.trajectory import TrainingView

F64 = torch.float64
XHACPO = HacpoConfig(mode="xhacpo", cross_ratio_unit="byte", cross_clip_style="pessimistic", cross_negatives="skip")


def t(values, grad=False):
    return torch.tensor(values, dtype=F64, requires_grad=grad)


def cross_loss(lp, src, adv, cfg, omega=1.0, m=0):
    """One cross sample; returns (loss, d loss / d learner log-prob, metrics)."""
    x = t([lp], grad=True)
    loss, metrics, _ = hacpo_policy_loss(x, t([src]), t([adv]), torch.tensor([False]), t([omega]), m, cfg)
    loss.backward()
    return loss.item(), x.grad.item(), metrics


# --- xhacpo: the pessimistic lower side ------------------------------------------------------


def test_xhacpo_keeps_a_peer_success_below_the_window_at_weight_s():
    # s = exp(-1.5 - -1.0) = exp(-0.5) = .606531 < L_0 = 0.8; A = 1, α = 1, ω = 1
    # paper: c = clip(s, .8, 1) = .8 (constant) -> no gradient
    _, grad, _ = cross_loss(-1.5, -1.0, 1.0, HacpoConfig())
    assert grad == 0.0
    # xhacpo: obj = s · sg(c)^α · ω · A = .606531 · .8 = .485225; d obj / d lp = s · .8 = .485225
    loss, grad, metrics = cross_loss(-1.5, -1.0, 1.0, XHACPO)
    assert loss == pytest.approx(-math.exp(-0.5) * 0.8, abs=1e-9)
    assert grad == pytest.approx(-math.exp(-0.5) * 0.8, abs=1e-9)
    assert metrics["cross_grad_frac"] == 1.0 and metrics["cross_clip_frac"] == 1.0


def test_xhacpo_matches_the_paper_inside_the_window_for_successes():
    # s = exp(-0.1) = .904837 in [.8, 1]: obj = s · sg(s) · ω · A; d/dlp = s² · ω · A = .818731 · 2 · .5
    for cfg in (HacpoConfig(), XHACPO):
        loss, grad, _ = cross_loss(-1.1, -1.0, 0.5, cfg, omega=2.0)
        assert loss == pytest.approx(-math.exp(-0.2) * 2.0 * 0.5, abs=1e-9)
        assert grad == pytest.approx(-math.exp(-0.2) * 2.0 * 0.5, abs=1e-9)


def test_xhacpo_never_pushes_down_a_peers_failure():
    # A = -1, s = .904837 in the window. Paper: d loss / d lp = -(s² · A) = +.818731.
    _, grad, metrics = cross_loss(-1.1, -1.0, -1.0, HacpoConfig())
    assert grad == pytest.approx(math.exp(-0.2), abs=1e-9)
    assert metrics["cross_grad_frac"] == 1.0
    # xhacpo (cross_negatives="skip"): the same loss value, no gradient.
    loss, grad, metrics = cross_loss(-1.1, -1.0, -1.0, XHACPO)
    assert loss == pytest.approx(math.exp(-0.2), abs=1e-9)
    assert grad == 0.0 and metrics["cross_grad_frac"] == 0.0


def test_xhacpo_own_samples_are_plain_gspo():
    x = t([-1.0, -1.0], grad=True)
    adv = t([1.0, -1.0])
    for cfg in (HacpoConfig(), XHACPO):
        x.grad = None
        loss, _, _ = hacpo_policy_loss(x, t([-1.0, -1.0]), adv, torch.tensor([True, True]), t([1.0, 1.0]), 0, cfg)
        loss.backward()
        # s = 1 for both: obj = A; loss = -(1 - 1)/2 = 0; d/dlp_i = -A_i / 2
        assert loss.item() == pytest.approx(0.0, abs=1e-12)
        assert x.grad.tolist() == pytest.approx([-0.5, 0.5], abs=1e-12)


def test_extension_settings_are_refused_outside_xhacpo():
    with pytest.raises(ValueError, match=r"\['cross_ratio_unit'\] only apply to mode 'xhacpo'"):
        HacpoConfig(cross_ratio_unit="byte")
    with pytest.raises(ValueError, match="cross_negatives must be one of"):
        HacpoConfig(mode="xhacpo", cross_negatives="sometimes")


# --- xhacpo: the tokenizer-invariant (per-byte) ratio -----------------------------------------


def _view(source, learner, response_ids, ratio_count, src_sum, text_bytes):
    return TrainingView("t", "p", source, learner, (1,), tuple(response_ids), ratio_count, 1.0,
                        src_sum / max(ratio_count, 1), False, src_sum, text_bytes)


def test_per_byte_ratio_cancels_tokenization_granularity():
    # The same 6-byte text, log p = -3 under both models: a char-level learner spells it in 6 tokens,
    # a BPE source in 2. Per token: learner -3/6 = -.5, source -3/2 = -1.5 -> s = e^1 = 2.718 (clipped
    # to 1: no gradient). Per byte: -3/6 against -3/6 -> s = 1.
    learner_logp = torch.full((1, 6), -0.5)  # (B, T)
    view = _view("bpe-lab", "char-lab", range(6), 6, -3.0, 6)
    per_token = learner_norms(learner_logp, [view], torch.tensor([False]))
    per_byte = learner_norms(learner_logp, [view], torch.tensor([True]))
    assert per_token.item() == pytest.approx(-0.5) and per_byte.item() == pytest.approx(-0.5)
    token_src = old_side([view], {}, torch.tensor([False]), []).norm
    byte_src = old_side([view], {}, torch.tensor([True]), []).norm
    assert token_src.item() == pytest.approx(-3.0 / 6)  # source_mean_logp as built above: -3/6
    assert byte_src.item() == pytest.approx(-0.5)
    view_bpe = _view("bpe-lab", "char-lab", range(6), 6, -3.0, 6)
    object.__setattr__(view_bpe, "source_mean_logp", -1.5)  # the BPE source's own mean: 2 tokens
    own_norm, peer_norm = (old_side([view_bpe], {}, torch.tensor([own]), []).norm.item() for own in (False, True))
    assert math.exp(per_token.item() - own_norm) == pytest.approx(math.e)
    assert math.exp(per_byte.item() - peer_norm) == pytest.approx(1.0)


# --- naive: a forged source log-prob cannot scale a gradient ----------------------------------


def test_naive_bounds_a_forged_low_source_logprob():
    naive = HacpoConfig(mode="naive")
    # Honest cross sample, s = 1, A = -1: obj = min(s·A, clip(s)·A) = -1; d loss / d lp = +1.
    _, honest, _ = cross_loss(-1.0, -1.0, -1.0, naive)
    assert honest == pytest.approx(1.0)
    # Forged source log-prob -50: s = exp(clamp(49, ±10)) = e^10 = 22026. Unbounded, the min picks
    # s·A and the gradient is 22026× the honest one; the dual clip at (1 + ε_high)·A holds it at 0.
    _, forged, _ = cross_loss(-1.0, -50.0, -1.0, naive)
    assert abs(forged) <= abs(honest) * (1 + naive.self_clip_high)
    assert forged == 0.0


def test_naive_own_samples_keep_the_plain_gspo_objective():
    # An own sample is not a claim by anyone else: min(s·A, clip(s)·A) unchanged (s = e^.5, A = -1).
    x = t([-0.5], grad=True)
    loss, _, _ = hacpo_policy_loss(
        x, t([-1.0]), t([-1.0]), torch.tensor([True]), t([1.0]), 0, HacpoConfig(mode="naive")
    )
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(0.5))
    assert x.grad.item() == pytest.approx(math.exp(0.5))


# --- sapo and grpo ---------------------------------------------------------------------------


def test_sapo_scores_peer_text_with_the_learners_own_old_policy():
    sapo = HacpoConfig(mode="sapo")
    cross = _view("peer", "me", range(3), 3, -9.0, 3)
    assert needs_own_old(cross, "me", sapo) and not needs_own_old(cross, "me", HacpoConfig())
    old = torch.tensor([-0.2, -0.4, -0.6])
    assert old_side([cross], {0: old}, torch.tensor([False]), []).norm.item() == pytest.approx(-0.4)
    # Advantages: the plain pooled baseline, like naive: r = [1, 0, 0, 1], mean .5, std .57735
    adv = hacpo_advantages(t([1.0, 0.0, 0.0, 1.0]), ["p"] * 4, ["me", "me", "peer", "peer"], "me", {}, sapo)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)


def test_sapo_cross_sample_above_the_window_with_negative_advantage_carries_gradient():
    # s = e^.001 = 1.0010005 > 1 + 4e-4, A = −1: min(s·A, clip(s)·A) = min(−1.0010005, −1.0004) = s·A,
    # so d loss / d lp = −(s·A) = 1.0010005 and the sample carries gradient (the flag says so too)
    _, grad, metrics = cross_loss(-0.999, -1.0, -1.0, HacpoConfig(mode="sapo"))
    assert grad == pytest.approx(math.exp(0.001), abs=1e-9)
    assert metrics["cross_grad_frac"] == 1.0 and metrics["cross_clip_frac"] == 1.0


def test_grpo_token_level_clip_higher():
    cfg = HacpoConfig(mode="grpo")
    # tokens: r = [e^.2 = 1.221403, e^.3 = 1.349859]; A = 1: the second is clipped to 1 + .28 = 1.28
    # obj = [1.221403, 1.28]; loss = -(1.221403 + 1.28) / 2 = -1.250701; only token 1 has gradient
    logp = t([[-1.0, -1.7]], grad=True)
    loss, metrics = grpo_token_loss(logp, t([[-1.2, -2.0]]), torch.ones(1, 2), t([1.0]), cfg)
    loss.backward()
    assert loss.item() == pytest.approx(-(math.exp(0.2) + 1.28) / 2, abs=1e-9)
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.2) / 2, 0.0], abs=1e-9)
    assert metrics["self_clip_frac"] == pytest.approx(0.5)
    # A = -1, r = e^-.3 = .740818 < 1 - .2: min(-.740818, -.8) = -.8 -> constant, no gradient
    logp = t([[-1.3]], grad=True)
    loss, _ = grpo_token_loss(logp, t([[-1.0]]), torch.ones(1, 1), t([-1.0]), cfg)
    loss.backward()
    assert loss.item() == pytest.approx(0.8) and logp.grad.item() == 0.0
    # Padding does not count: a masked token changes nothing.
    loss_masked, _ = grpo_token_loss(t([[-1.3, -9.0]]), t([[-1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), t([-1.0]), cfg)
    assert loss_masked.item() == pytest.approx(0.8)


def test_grpo_and_gspo_ignore_other_agents():
    for mode in ("grpo", "gspo"):
        adv = hacpo_advantages(t([1.0, 0.0, 1.0]), ["p"] * 3, ["me", "me", "peer"], "me", {}, HacpoConfig(mode=mode))
        # own group [1, 0]: mean .5, std .707107 -> ±.707106; the peer's sample gets 0
        assert adv.tolist() == pytest.approx([0.707106, -0.707106, 0.0], abs=1e-5)


# --- diagnostics measure what they say -------------------------------------------------------


def test_cross_lower_bound_is_only_reported_where_cross_samples_are():
    x = t([-1.0], grad=True)
    _, metrics, _ = hacpo_policy_loss(
        x, t([-1.0]), t([1.0]), torch.tensor([True]), t([1.0]), 0, HacpoConfig(mode="gspo")
    )
    assert math.isnan(metrics["cross_lower_bound"])
    _, _, metrics = cross_loss(-1.0, -1.0, 1.0, HacpoConfig(), m=2)
    assert metrics["cross_lower_bound"] == pytest.approx(0.85)  # 0.8 + 2 · 0.025


def test_cross_summary_per_source():
    rows = [("a", 0.5, 1.0, False), ("a", 0.9, -1.0, True), ("a", 0.95, 1.0, True), ("b", 1.2, 0.0, False)]
    out = summarize_cross(rows)
    # source a: ratios sorted [.5, .9, .95]: p10 -> index 0, p50 -> index 1, p90 -> index 2
    assert (out["cross/a/ratio_p10"], out["cross/a/ratio_p50"], out["cross/a/ratio_p90"]) == (0.5, 0.9, 0.95)
    assert out["cross/a/grad_frac"] == pytest.approx(2 / 3)
    assert out["cross/a/grad_pos_frac"] == pytest.approx(1 / 2)  # of the 2 carriers, 1 has A > 0
    assert out["cross/a/pos_frac"] == pytest.approx(2 / 3)
    # source b: one sample with A = 0, carrying nothing: no sign statistics at all
    assert out["cross/b/grad_frac"] == 0.0 and "cross/b/grad_pos_frac" not in out and "cross/b/pos_frac" not in out
