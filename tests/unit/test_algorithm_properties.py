"""Property tests (hypothesis) for invariants of the HACPO advantage and loss."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacfed.algorithm import HacpoConfig, hacpo_advantages, hacpo_policy_loss

AGENTS = ["a", "b", "c"]
caps_st = st.fixed_dictionaries({a: st.floats(1e-8, 1.0) for a in AGENTS})
sample_st = st.tuples(st.sampled_from(AGENTS), st.sampled_from([0.0, 1.0, 0.5]))
mode_st = st.sampled_from(["hacpo", "naive", "gspo"])


@settings(max_examples=200, deadline=None)
@given(samples=st.lists(sample_st, min_size=1, max_size=12), caps=caps_st, mode=mode_st, data=st.data())
def test_advantages_finite_and_permutation_equivariant(samples, caps, mode, data):
    cfg = HacpoConfig(mode=mode)
    sources = [s for s, _ in samples]
    rewards = torch.tensor([r for _, r in samples], dtype=torch.float64)
    prompts = ["p"] * len(samples)
    adv = hacpo_advantages(rewards, prompts, sources, "a", caps, cfg)
    assert torch.isfinite(adv).all()
    perm = data.draw(st.permutations(list(range(len(samples)))))
    adv_p = hacpo_advantages(rewards[perm], prompts, [sources[i] for i in perm], "a", caps, cfg)
    assert torch.allclose(adv_p, adv[perm], atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    sources=st.lists(st.sampled_from(AGENTS), min_size=1, max_size=10),
    value=st.sampled_from([0.0, 1.0, 0.25]),
    caps=caps_st,
    mode=mode_st,
)
def test_uniform_groups_give_exactly_zero(sources, value, caps, mode):
    rewards = torch.full((len(sources),), value, dtype=torch.float64)
    adv = hacpo_advantages(rewards, ["p"] * len(sources), sources, "b", caps, HacpoConfig(mode=mode))
    assert (adv == 0).all()


@settings(max_examples=100, deadline=None)
@given(
    groups=st.lists(st.lists(sample_st, min_size=1, max_size=6), min_size=1, max_size=4),
    caps=caps_st,
)
def test_groups_are_independent(groups, caps):
    # Advantages of one group do not depend on which other groups share the batch.
    cfg = HacpoConfig()
    rewards, prompts, sources = [], [], []
    for g, members in enumerate(groups):
        for src, r in members:
            rewards.append(r), prompts.append(f"p{g}"), sources.append(src)
    full = hacpo_advantages(torch.tensor(rewards, dtype=torch.float64), prompts, sources, "a", caps, cfg)
    first = len(groups[0])
    alone = hacpo_advantages(
        torch.tensor(rewards[:first], dtype=torch.float64), prompts[:first], sources[:first], "a", caps, cfg
    )
    assert torch.allclose(full[:first], alone, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(
    log_ratios=st.lists(st.floats(-30, 30), min_size=1, max_size=8),
    advs=st.lists(st.floats(-5, 5), min_size=8, max_size=8),
    m=st.integers(0, 20),
)
def test_cross_samples_weight_bounded_by_omega(log_ratios, advs, m):
    # Whatever log-prob a source claims, a cross sample contributes at most ω·|A| (c ≤ 1).
    n = len(log_ratios)
    lp = torch.tensor(log_ratios, dtype=torch.float64)
    adv = torch.tensor(advs[:n], dtype=torch.float64)
    omega = torch.full((n,), 2.0, dtype=torch.float64)
    loss, _, _ = hacpo_policy_loss(
        lp, torch.zeros(n, dtype=torch.float64), adv, torch.zeros(n, dtype=torch.bool), omega, m, HacpoConfig()
    )
    assert torch.isfinite(loss)
    assert abs(loss.item()) <= (omega * adv.abs()).mean().item() + 1e-9


CONFIGS = [
    HacpoConfig(), HacpoConfig(mode="naive"), HacpoConfig(mode="sapo"), HacpoConfig(mode="gspo"),
    HacpoConfig(cross_clip=False), HacpoConfig(stepwise_clip=False), HacpoConfig(alpha=0.0),
    HacpoConfig(mode="xhacpo", cross_clip_style="pessimistic", cross_negatives="skip"),
]


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(st.floats(-12, 12), st.sampled_from([-1.5, -0.5, 0.0, 0.5, 1.5]), st.booleans()),
                  min_size=1, max_size=8),
    cfg=st.sampled_from(CONFIGS),
    m=st.integers(0, 10),
)
def test_carries_flag_is_exactly_where_autograd_gives_a_gradient(rows, cfg, m):
    # The per-sample flag the update's diagnostics read must say what backward does.
    # Log-ratios near the window edges: a multiple of 1e-4 plus 3e-5, never on a bound exactly.
    lp = torch.tensor([round(x, 4) + 3e-5 if abs(x) < 0.3 else x for x, _, _ in rows], dtype=torch.float64,
                      requires_grad=True)
    adv = torch.tensor([a for _, a, _ in rows], dtype=torch.float64)
    is_self = torch.tensor([own for _, _, own in rows])
    if cfg.mode == "gspo" and not bool(is_self.any()):
        is_self[0] = True
    omega = torch.full((len(rows),), 0.5, dtype=torch.float64)
    loss, _, flags = hacpo_policy_loss(lp, torch.zeros(len(rows), dtype=torch.float64), adv, is_self, omega, m, cfg)
    loss.backward()
    assert flags.carries.tolist() == (lp.grad != 0).tolist()
