"""HACPO math pinned against numbers worked by hand (docs/hacpo.md §2-§5), arithmetic in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from hacfed.algorithm import HacpoConfig, capability_ratio, cross_clip_lower, hacpo_advantages, hacpo_policy_loss, kl_k3

CFG = HacpoConfig()
F64 = torch.float64


def t(values, dtype=F64, grad=False):
    return torch.tensor(values, dtype=dtype, requires_grad=grad)


# --- capability ratios ----------------------------------------------------------------------


def test_capability_ratio_plain_and_clipped():
    caps = {"a": 0.5, "b": 0.25, "strong": 0.9, "weak": 0.05}
    # 0.25 / 0.5 = 0.5
    assert capability_ratio(caps, "b", "a", CFG) == pytest.approx(0.5, abs=1e-12)
    # 0.5 / 0.25 = 2
    assert capability_ratio(caps, "a", "b", CFG) == pytest.approx(2.0, abs=1e-12)
    # 0.9 / 0.05 = 18 -> clipped to ratio_max 10
    assert capability_ratio(caps, "strong", "weak", CFG) == 10.0
    # 0.05 / 0.9 = 0.0556 -> clipped to ratio_min 0.1
    assert capability_ratio(caps, "weak", "strong", CFG) == 0.1
    # same agent -> exactly 1, whatever P̂ is
    assert capability_ratio(caps, "weak", "weak", CFG) == 1.0


def test_capability_ratio_respects_custom_bounds_and_rejects_unknown():
    cfg = HacpoConfig(ratio_min=0.5, ratio_max=2.0)
    assert capability_ratio({"a": 0.9, "b": 0.1}, "a", "b", cfg) == 2.0  # 9 -> 2
    with pytest.raises(ValueError, match="'zed'"):
        capability_ratio({"a": 0.5}, "zed", "a", CFG)
    with pytest.raises(ValueError, match="nan"):
        capability_ratio({"a": 0.5, "b": math.nan}, "b", "a", CFG)


# --- advantages -----------------------------------------------------------------------------


def test_advantages_capability_weighted_baseline_two_agents():
    # learner a: P̂_a = 0.5, P̂_b = 0.25 -> ratio(b, a) = 0.5 -> w_b = 1 / 0.5 = 2, w_a = 1
    # group rewards a:[1, 0] b:[1, 0]; μ = (1·1 + 1·0 + 2·1 + 2·0) / 4 = 0.75
    # unbiased std of [1,0,1,0] = sqrt(1 / 3) = 0.577350
    # A(1) = 0.25 / (0.577350 + 1e-6) = 0.433012; A(0) = -0.75 / 0.577351 = -1.299036
    adv = hacpo_advantages(t([1.0, 0.0, 1.0, 0.0]), ["p"] * 4, ["a", "a", "b", "b"], "a", {"a": 0.5, "b": 0.25}, CFG)
    std = math.sqrt(1 / 3) + 1e-6
    expected = [0.25 / std, -0.75 / std, 0.25 / std, -0.75 / std]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert expected[0] == pytest.approx(0.433012, abs=1e-6)


def test_advantages_learner_b_sees_the_other_weighting():
    # learner b: w_a = 1 / ratio(a, b) = 1 / clip(0.5 / 0.25) = 0.5
    # μ = (0.5·1 + 0.5·0 + 1 + 0) / 4 = 0.375; A(1) = 0.625 / 0.577351, A(0) = -0.375 / 0.577351
    adv = hacpo_advantages(t([1.0, 0.0, 1.0, 0.0]), ["p"] * 4, ["a", "a", "b", "b"], "b", {"a": 0.5, "b": 0.25}, CFG)
    std = math.sqrt(1 / 3) + 1e-6
    assert adv.tolist() == pytest.approx([0.625 / std, -0.375 / std] * 2, abs=1e-6)


def test_advantages_binary_guard_uses_learners_own_mean():
    # learner a: P̂_a = 1.0, P̂_b = 0.1 -> ratio(b, a) = 0.1 -> w_b = 10
    # rewards a:[0, 1] b:[1, 1]: μ = (0 + 1 + 10 + 10) / 4 = 5.25 > reward_max 1 -> μ = mean(a's) = 0.5
    # unbiased std of [0,1,1,1]: mean .75, Σdev² = .5625 + 3·.0625 = .75, /3 = .25 -> std .5
    # A = (r - .5) / .500001 -> ±0.999998
    adv = hacpo_advantages(t([0.0, 1.0, 1.0, 1.0]), ["p"] * 4, ["a", "a", "b", "b"], "a", {"a": 1.0, "b": 0.1}, CFG)
    assert adv.tolist() == pytest.approx([-0.5 / 0.500001] + [0.5 / 0.500001] * 3, abs=1e-6)


def test_advantages_binary_guard_without_own_samples_uses_the_plain_group_mean():
    # learner me has no sample of this prompt (its submission was lost). P̂ me .8, zed .2, amy .4:
    # w_zed = 1 / clip(.2 / .8) = 4, w_amy = 1 / clip(.4 / .8) = 2
    # rewards zed [1, 0], amy [1, 1]: μ = (4 + 0 + 2 + 2) / 4 = 2 > reward_max 1 -> guard fires; no own
    # reward to fall back on -> the unweighted mean (1 + 0 + 1 + 1) / 4 = .75
    # std of [1,0,1,1] = .5: A(1) = .25 / .500001 = .499999, A(0) = −.75 / .500001 = −1.499997
    adv = hacpo_advantages(t([1.0, 0.0, 1.0, 1.0]), ["q"] * 4, ["zed", "zed", "amy", "amy"], "me",
                           {"me": 0.8, "zed": 0.2, "amy": 0.4}, CFG)
    assert adv.tolist() == pytest.approx([0.499999, -1.499997, 0.499999, 0.499999], abs=1e-6)


def test_advantages_uniform_guard_zero_even_with_weights():
    # all rewards 1: weighted μ would be (1 + 10) / 2 = 5.5, but the uniform guard comes first -> A = 0
    adv = hacpo_advantages(t([1.0, 1.0]), ["p", "p"], ["a", "b"], "a", {"a": 1.0, "b": 0.1}, CFG)
    assert adv.tolist() == [0.0, 0.0]


def test_advantages_three_agents_and_separate_groups():
    # learner a: P̂ a=.4, b=.8, c=.2 -> w_b = 1/clip(.8/.4) = .5, w_c = 1/clip(.2/.4) = 2
    # group p rewards a:[1,0] b:[1,1] c:[0,1]; μ = (1 + 0 + .5 + .5 + 0 + 2) / 6 = 4/6 = 0.666667
    # raw rewards [1,0,1,1,0,1]: mean 2/3, Σdev² = 4·(1/9) + 2·(4/9) = 4/3, /5 = .266667 -> std .516398
    # A(1) = (1/3) / .516399 = .645496, A(0) = -(2/3) / .516399 = -1.290992
    # group q (all zeros) -> uniform guard -> 0
    rewards = t([1, 0, 1, 1, 0, 1, 0, 0, 0])
    prompts = ["p"] * 6 + ["q"] * 3
    sources = ["a", "a", "b", "b", "c", "c", "a", "b", "c"]
    adv = hacpo_advantages(rewards, prompts, sources, "a", {"a": 0.4, "b": 0.8, "c": 0.2}, CFG)
    std = math.sqrt(0.8 / 3) + 1e-6
    hi, lo = (1 / 3) / std, -(2 / 3) / std
    assert hi == pytest.approx(0.645496, abs=1e-6) and lo == pytest.approx(-1.290992, abs=1e-6)
    assert adv.tolist() == pytest.approx([hi, lo, hi, hi, lo, hi, 0.0, 0.0, 0.0], abs=1e-6)


def test_advantages_single_sample_group_is_uniform_hence_zero():
    # A one-sample group has identical rewards, so the uniform guard (checked first) gives 0;
    # the std = 1 rule only keeps the formula defined.
    adv = hacpo_advantages(t([1.0, 1.0, 0.0]), ["solo", "p", "p"], ["b", "a", "b"], "a", {"a": 0.5, "b": 0.5}, CFG)
    assert adv[0].item() == 0.0
    assert adv[1].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)


def test_advantages_naive_mode_plain_pooled_baseline():
    # naive ignores capabilities: μ = mean([1,0,1,0]) = .5 ; A = ±.5 / .577351
    adv = hacpo_advantages(
        t([1.0, 0.0, 1.0, 0.0]), ["p"] * 4, ["a", "a", "b", "b"], "a", {"a": 1.0, "b": 0.1},
        HacpoConfig(mode="naive"),
    )
    std = math.sqrt(1 / 3) + 1e-6
    assert adv.tolist() == pytest.approx([0.5 / std, -0.5 / std] * 2, abs=1e-6)


def test_advantages_without_capability_baseline_matches_naive_weights():
    cfg = HacpoConfig(capability_baseline=False)
    args = (t([1.0, 0.0, 1.0, 0.0]), ["p"] * 4, ["a", "a", "b", "b"], "a", {"a": 1.0, "b": 0.1})
    assert hacpo_advantages(*args, cfg).tolist() == hacpo_advantages(*args, HacpoConfig(mode="naive")).tolist()


def test_advantages_gspo_mode_uses_own_group_only():
    # own rewards [1, 0]: μ = .5, std = sqrt(.5) = .707107 -> A = ±.5 / .707108 ; others 0
    adv = hacpo_advantages(
        t([1.0, 0.0, 1.0, 1.0]), ["p"] * 4, ["a", "a", "b", "b"], "a", {"a": 0.5, "b": 0.5}, HacpoConfig(mode="gspo")
    )
    std = math.sqrt(0.5) + 1e-6
    assert adv.tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], abs=1e-6)


# --- stepwise clipping ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "m, expected",
    [(0, 0.8), (1, 0.825), (4, 0.9), (7, 0.975), (8, 1.0), (20, 1.0)],  # 1 - .2 + m·.025, capped at 1
)
def test_cross_clip_lower_schedule(m, expected):
    assert cross_clip_lower(m, CFG) == pytest.approx(expected, abs=1e-12)


def test_cross_clip_lower_static_when_stepwise_off():
    assert cross_clip_lower(8, HacpoConfig(stepwise_clip=False)) == pytest.approx(0.8)


# --- policy loss: value and gradient ----------------------------------------------------------


def _batch():
    # 0: own,   s = exp(0)     = 1          inside [1-3e-4, 1+4e-4]  A =  2   -> obj 2, d obj/d lp = s·A = 2
    # 1: own,   s = exp(.001)  = 1.0010005  above 1+4e-4             A =  1   -> min(1.0010005, 1.0004) = 1.0004, grad 0
    # 2: cross, s = exp(-.1)   = 0.904837   inside [0.8, 1]          A = .5, ω = 2
    #           obj = c·sg(c)·ω·A = .904837² · 2 · .5 = 0.818731 ; d obj/d lp = c^(α+1)·ω·A = 0.818731
    # 3: cross, s = exp(-.5)   = 0.606531   below 0.8 -> c = 0.8     A = -1, ω = .5
    #           obj = .8 · .8 · .5 · -1 = -0.32 ; grad 0
    lp = t([-1.0, -0.999, -1.1, -1.5], grad=True)
    src = t([-1.0, -1.0, -1.0, -1.0])
    adv = t([2.0, 1.0, 0.5, -1.0])
    is_self = torch.tensor([True, True, False, False])
    omega = t([1.0, 1.0, 2.0, 0.5])
    return lp, src, adv, is_self, omega


def test_policy_loss_value_and_gradient():
    lp, src, adv, is_self, omega = _batch()
    loss, metrics, _ = hacpo_policy_loss(lp, src, adv, is_self, omega, 0, CFG)
    # loss = -(2 + 1.0004 + 0.818731 - 0.32) / 4 = -0.874783
    expected = -(2 + 1.0004 + math.exp(-0.2) - 0.32) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(-0.874783, abs=1e-6)
    loss.backward()
    # d loss / d lp = -(1/4) · d obj: [-0.5, 0, -0.818731/4 = -0.204683, 0]
    assert lp.grad.tolist() == pytest.approx([-0.5, 0.0, -math.exp(-0.2) / 4, 0.0], abs=1e-6)
    assert metrics["self_clip_frac"] == pytest.approx(0.5)
    assert metrics["cross_clip_frac"] == pytest.approx(0.5)
    assert metrics["cross_lower_bound"] == pytest.approx(0.8)
    assert metrics["self_ratio_mean"] == pytest.approx((1 + math.exp(0.001)) / 2, abs=1e-9)


def test_own_sample_lower_clip_is_epsilon_low_not_epsilon_high():
    # s = exp(−.00035) = .99965: below 1 − ε_low = .9997 but above 1 − ε_high = .9996
    # A = −1: min(s·A, clip(s)·A) = min(−.99965, −.9997) = −.9997, a constant -> no gradient
    lp = t([-1.00035], grad=True)
    loss, metrics, _ = hacpo_policy_loss(lp, t([-1.0]), t([-1.0]), torch.tensor([True]), t([1.0]), 0, CFG)
    loss.backward()
    assert loss.item() == pytest.approx(0.9997, abs=1e-12)
    assert lp.grad.item() == 0.0 and metrics["self_clip_frac"] == 1.0
    # A = +1: min(.99965, .9997) = s·A -> gradient −s (the loss is −obj)
    lp = t([-1.00035], grad=True)
    loss, _, _ = hacpo_policy_loss(lp, t([-1.0]), t([1.0]), torch.tensor([True]), t([1.0]), 0, CFG)
    loss.backward()
    assert lp.grad.item() == pytest.approx(-math.exp(-0.00035), abs=1e-12)


def test_cross_gradient_scale_follows_alpha_detached():
    # alpha = 2: obj = c · sg(c)² · ω · A ; grad = c³ · ω · A (not 3c³ω A as without the stop-gradient)
    cfg = HacpoConfig(alpha=2.0)
    lp = t([-1.1], grad=True)
    loss, _, _ = hacpo_policy_loss(lp, t([-1.0]), t([0.5]), torch.tensor([False]), t([2.0]), 0, cfg)
    loss.backward()
    c = math.exp(-0.1)  # 0.904837
    assert loss.item() == pytest.approx(-(c**3) * 2 * 0.5, abs=1e-9)
    assert lp.grad.item() == pytest.approx(-(c**3) * 2 * 0.5, abs=1e-9)  # c^{α+1}·ω·A = .740818


def test_no_cross_gradient_outside_the_clip_range_and_stepwise_bound_moves():
    lp = t([-1.1, -0.9], grad=True)  # s = .904837 and 1.105171
    args = (t([-1.0, -1.0]), t([1.0, 1.0]), torch.tensor([False, False]), t([1.0, 1.0]))
    loss, _, _ = hacpo_policy_loss(lp, *args, 0, CFG)
    loss.backward()
    # s = 1.105 > 1 -> c = 1, no gradient; s = .9048 inside [.8, 1] -> gradient -c²/2
    assert lp.grad.tolist() == pytest.approx([-math.exp(-0.2) / 2, 0.0], abs=1e-9)
    # after 8 minibatch updates L_m = 1: s = .9048 is clipped to 1 too -> obj = 1 each, no gradient
    lp2 = t([-1.1, -0.9], grad=True)
    loss2, m2, _ = hacpo_policy_loss(lp2, *args, 8, CFG)
    loss2.backward()
    assert loss2.item() == pytest.approx(-1.0, abs=1e-12)
    assert lp2.grad.tolist() == [0.0, 0.0]
    assert m2["cross_clip_frac"] == 1.0


def test_ablations_static_bound_and_no_clip_and_no_omega():
    lp = t([-1.5])  # s = exp(-.5) = .606531
    args = (t([-1.0]), t([1.0]), torch.tensor([False]), t([3.0]))
    # no clipping: obj = s · s · ω · A = .367879 · 3
    loss, _, _ = hacpo_policy_loss(lp, *args, 0, HacpoConfig(cross_clip=False))
    assert loss.item() == pytest.approx(-math.exp(-1.0) * 3, abs=1e-9)
    # static bound: even at m = 8 the lower bound stays .8 -> c = .8, obj = .64 · 3
    loss, _, _ = hacpo_policy_loss(lp, *args, 8, HacpoConfig(stepwise_clip=False))
    assert loss.item() == pytest.approx(-0.64 * 3, abs=1e-9)
    # no ω: coefficient 1 -> obj = .64
    loss, _, _ = hacpo_policy_loss(lp, *args, 0, HacpoConfig(capability_coefficient=False))
    assert loss.item() == pytest.approx(-0.64, abs=1e-9)


def test_naive_mode_clips_every_sample_like_own():
    # cross sample s = .904837 < 1 - 3e-4, A = .5: min(.452419, .9997 · .5 = .49985) = .452419; no ω, no α
    lp = t([-1.1], grad=True)
    naive = HacpoConfig(mode="naive")
    loss, _, _ = hacpo_policy_loss(lp, t([-1.0]), t([0.5]), torch.tensor([False]), t([5.0]), 0, naive)
    assert loss.item() == pytest.approx(-math.exp(-0.1) * 0.5, abs=1e-9)
    loss.backward()
    assert lp.grad.item() == pytest.approx(-math.exp(-0.1) * 0.5, abs=1e-9)


def test_gspo_mode_ignores_cross_samples():
    lp, src, adv, is_self, omega = _batch()
    loss, m, _ = hacpo_policy_loss(lp, src, adv, is_self, omega, 0, HacpoConfig(mode="gspo"))
    assert loss.item() == pytest.approx(-(2 + 1.0004) / 2, abs=1e-9)
    assert m["num_cross"] == 0.0


def test_log_ratio_is_clamped():
    # learner − source = 50 -> clamped to 10 -> s = e^10; own sample with A < 0 keeps the unclipped s·A
    loss, _, _ = hacpo_policy_loss(t([0.0]), t([-50.0]), t([-1.0]), torch.tensor([True]), t([1.0]), 0, CFG)
    assert loss.item() == pytest.approx(math.exp(10.0), rel=1e-9)


def test_reduction_one_agent_ratio_one_equals_gspo():
    # A single agent, all own samples, capability ratio 1: HACPO must be exactly GSPO.
    gen = torch.Generator().manual_seed(0)
    lp = (torch.randn(16, generator=gen, dtype=F64) * 1e-3 - 1.0).requires_grad_(True)
    src = torch.full((16,), -1.0, dtype=F64)
    adv = torch.randn(16, generator=gen, dtype=F64)
    is_self = torch.ones(16, dtype=torch.bool)
    ones = torch.ones(16, dtype=F64)
    hacpo, _, _ = hacpo_policy_loss(lp, src, adv, is_self, ones, 3, CFG)
    gspo, _, _ = hacpo_policy_loss(lp, src, adv, is_self, ones, 3, HacpoConfig(mode="gspo"))
    s = torch.exp(lp - src)
    reference = -torch.minimum(s * adv, torch.clamp(s, 1 - 3e-4, 1 + 4e-4) * adv).mean()
    assert hacpo.item() == pytest.approx(gspo.item(), abs=1e-12)
    assert hacpo.item() == pytest.approx(reference.item(), abs=1e-12)
    (g1,) = torch.autograd.grad(hacpo, lp)
    (g2,) = torch.autograd.grad(reference, lp)
    assert torch.allclose(g1, g2, atol=1e-12)


# --- KL ---------------------------------------------------------------------------------------


def test_kl_k3_hand_values():
    # seq 0: tokens (logp, ref) = (-1, -1.5), (-2, -2), masked (-9, 0)
    #   d = ref - logp = -.5, 0 ; k3 = e^-.5 + .5 - 1 = .106531, 0 -> token mean .053265
    # seq 1: (-1, -1) -> 0 ; mean over sequences = .026633
    logp = t([[-1.0, -2.0, -9.0], [-1.0, -3.0, -3.0]], grad=True)
    ref = t([[-1.5, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    kl = kl_k3(logp, ref, mask)
    k = math.exp(-0.5) + 0.5 - 1
    assert kl.item() == pytest.approx(k / 2 / 2, abs=1e-9)
    kl.backward()
    # d k3 / d logp = 1 - exp(ref - logp) = 1 - e^-.5 = .393469, times 1/2 (token mean) · 1/2 (seq mean)
    assert logp.grad[0, 0].item() == pytest.approx((1 - math.exp(-0.5)) / 4, abs=1e-9)
    assert logp.grad[0, 2].item() == 0.0 and logp.grad[1, 1].item() == 0.0


def test_kl_k3_zero_for_identical_policies():
    x = torch.randn(3, 5, dtype=F64)
    assert kl_k3(x, x.clone(), torch.ones(3, 5)).item() == 0.0


# --- validation -------------------------------------------------------------------------------


def test_config_validation_names_field_and_value():
    with pytest.raises(ValueError, match="mode.*'ppo'"):
        HacpoConfig(mode="ppo")
    with pytest.raises(ValueError, match="cross_clip_delta.*1.5"):
        HacpoConfig(cross_clip_delta=1.5)
    with pytest.raises(ValueError, match="capability_window.*0"):
        HacpoConfig(capability_window=0)
    with pytest.raises(ValueError, match="alpha.*nan"):
        HacpoConfig(alpha=float("nan"))
    with pytest.raises(ValueError, match="stepwise_clip"):
        HacpoConfig(stepwise_clip="yes")
    with pytest.raises(ValueError, match="ratio_max"):
        HacpoConfig(ratio_min=2.0, ratio_max=1.0)
    assert HacpoConfig.from_dict(HacpoConfig(alpha=2.0).to_dict()) == HacpoConfig(alpha=2.0)
    with pytest.raises(ValueError, match="bogus"):
        HacpoConfig.from_dict({"bogus": 1})


def test_loss_rejects_bad_inputs_with_value():
    lp, src, adv, is_self, omega = _batch()
    with pytest.raises(ValueError, match="advantages must be finite, got nan"):
        hacpo_policy_loss(lp, src, t([1.0, math.nan, 0.0, 0.0]), is_self, omega, 0, CFG)
    with pytest.raises(ValueError, match="source_mean_logp has shape \\(3,\\)"):
        hacpo_policy_loss(lp, src[:3], adv, is_self, omega, 0, CFG)
    with pytest.raises(ValueError, match="update_index.*-1"):
        hacpo_policy_loss(lp, src, adv, is_self, omega, -1, CFG)
    with pytest.raises(ValueError, match="capability_ratios must be > 0"):
        hacpo_policy_loss(lp, src, adv, is_self, t([1.0, 1.0, 0.0, 1.0]), 0, CFG)
    with pytest.raises(ValueError, match="is_self"):
        hacpo_policy_loss(lp, src, adv, is_self.long(), omega, 0, CFG)
    with pytest.raises(ValueError, match="source_mean_logp must be finite, got -inf"):
        hacpo_policy_loss(lp, t([-1.0, -math.inf, -1.0, -1.0]), adv, is_self, omega, 0, CFG)


def test_advantages_reject_bad_inputs():
    with pytest.raises(ValueError, match="differ in length"):
        hacpo_advantages(t([1.0, 0.0]), ["p"], ["a", "a"], "a", {"a": 1.0}, CFG)
    with pytest.raises(ValueError, match="rewards must be finite, got inf"):
        hacpo_advantages(t([1.0, math.inf]), ["p", "p"], ["a", "a"], "a", {"a": 1.0}, CFG)
    with pytest.raises(ValueError, match="'ghost'"):
        hacpo_advantages(t([1.0, 0.0]), ["p", "p"], ["a", "ghost"], "a", {"a": 1.0}, CFG)


def test_config_rejects_bools_for_numbers_and_ablations_outside_hacpo():
    with pytest.raises(ValueError, match="capability_window must be a number, got True"):
        HacpoConfig(capability_window=True)
    with pytest.raises(ValueError, match="kl_coef must be a number, got False"):
        HacpoConfig(kl_coef=False)
    with pytest.raises(ValueError, match=r"\['stepwise_clip'\] only apply to modes \('hacpo', 'xhacpo'\), not 'naive'"):
        HacpoConfig(mode="naive", stepwise_clip=False)
